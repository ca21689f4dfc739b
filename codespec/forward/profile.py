"""The machine profile: what the engine learns about a machine once, kept in the cache.

Two things cost seconds to learn and come out the same on every start on one machine:
* the probes that keep verify passes row-exact: `rowblocks.probe` (the most rows the
  linear layers multiply like a decode step; ~5.5 s on the default model, 2-core EPYC,
  because it multiplies lm_head 126 times) and `rowcalls.probe` (padded attention
  calls; 0.2 s);
* the verify-pass timings the goodput controller's cost model starts from
  (`Engine.calibrate`: 43 passes, ~10 s).
Each backend (base.py) builds its own key: `torch_key` or `rows_key`.

Done inside a request, they made speculation slower than plain decoding in every
fresh `codespec generate` process. So they are stored per machine and
setting, and every later process reads them in milliseconds:

    profile = load(cache_dir, key)       # None: missing, corrupt or for another setting
    save(cache_dir, Profile(key, row_block=64, padded_rows=True, timings=[(2, 1024, 0.11)]))

The key holds everything that can change a kernel's choice or a pass's cost: the CPU
(model name and instruction-set flags) or GPU, the environment variables that cap
oneDNN/MKL's instruction sets, torch's and transformers' versions and build, the
model's shapes, dtype, device and thread count, and the kernel-layout constants of
rowcalls/rowblocks. A file whose key differs from the current one is stale and is
ignored (and replaced at the next save); an unreadable one likewise. A probe result
is only ever reused on the setting it was measured on: that is what keeps "Lossless on
every machine" true with a cache. Files are written to a temporary sibling and
renamed, so a reader never sees half a profile.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from codespec.settings import environment_switches

# Bump when what a profile means changes (cost features, probe semantics). 2
# (2026-11-28): the share of their wall time the timed passes ran is recorded, and timings taken on a
# busy machine are not stored (engine.busy_share); a format-1 file may hold such timings, so it
# is measured again once.
FORMAT = 2
SUBDIR = "calibration"
# Environment variables that change which kernels oneDNN, MKL or ATen pick.
KERNEL_ENV = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS",
              "MKL_CBWR", "ONEDNN_DEFAULT_FPMATH_MODE")
# The model config fields that fix every weight shape and the attention layout.
SHAPE_FIELDS = ("architectures", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "vocab_size", "tie_word_embeddings", "max_position_embeddings")

log = logging.getLogger("codespec.forward.profile")


@dataclass
class Profile:
    """One machine and setting's probe results and verify-pass timings."""

    key: dict[str, str]
    row_block: int  # rowblocks.probe
    padded_rows: bool  # rowcalls.probe
    timings: list[tuple[int, int, float]] = field(default_factory=list)  # (rows, attended keys, seconds)
    created: float = field(default_factory=time.time)  # Unix time
    share: float | None = None  # of their wall time the timed passes ran (engine.busy_share; None: not measured)

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "key": self.key, "row_block": self.row_block, "padded_rows": self.padded_rows,
                "timings": [list(t) for t in self.timings], "created": self.created, "share": self.share}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Profile:
        if data.get("format") != FORMAT:
            raise ValueError(f"format {data.get('format')!r}, expected {FORMAT}")
        timings = [(int(rows), int(keys), float(seconds)) for rows, keys, seconds in data["timings"]]
        if any(rows < 1 or keys < 0 or not seconds > 0 for rows, keys, seconds in timings):
            raise ValueError("a timing is out of range")
        share = data.get("share")
        return cls({str(k): str(v) for k, v in data["key"].items()}, int(data["row_block"]),
                   bool(data["padded_rows"]), timings, float(data["created"]),
                   None if share is None else float(share))


def torch_key(model: Any, backend: str) -> dict[str, str]:
    """The key of transformers' forward (`backend`: "transformers"): the model's
    device and dtype, torch's thread count now, the kernel layout the probes depend on,
    and the machine."""
    import torch
    import transformers

    from codespec.forward import rowblocks, rowplan

    embed = model.get_input_embeddings().weight  # never a packed (meta) copy
    device, dtype, threads = embed.device, embed.dtype, torch.get_num_threads()
    config = model.config
    dtype_name = str(dtype).removeprefix("torch.")
    key = _key(config, model_source(model, dtype_name), dtype_name, device, threads,
               f"key_block={rowplan.KEY_BLOCK},q_block={rowplan.Q_BLOCK},q_split={rowplan.Q_SPLIT_LIMIT},"
               f"max_block={rowblocks.MAX_BLOCK},linear={rowblocks.linear_kernel(dtype, device)},"
               f"forward={backend}")
    key.update(torch=torch.__version__, torch_build=_digest(torch.__config__.show()),
               transformers=transformers.__version__)
    if str(device).startswith("cpu"):
        key["cpu_capability"] = str(torch.backends.cpu.get_cpu_capability())
    return key


def model_source(model: Any, dtype_name: str) -> str:
    """The model directory a transformers model was loaded from: a serving-dtype copy
    (models/loading.py, `<model>/<dtype>`) names its model, so both share one key."""
    source = Path(str(getattr(model.config, "_name_or_path", "") or getattr(model, "name_or_path", "")))
    return str(source.parent if source.name == dtype_name else source)


def rows_key(config: Any, source: str, threads: int, quantize: str = "none", isa: int = 2) -> dict[str, str]:
    """The key of the C row decoder (rows.py): the same whichever way its weights were
    loaded (safetensors or a transformers model: the same bits and the same kernels).
    `isa`: rowgemm's path (AMX 3, AVX-512 BF16 2, AVX2 1, scalar 0): other costs, other
    bits; `kernels`: the C library's build (new kernels, new pass costs: measured again)."""
    from codespec.forward import rowplan
    from codespec.kernels import native

    return _key(config, source, "bfloat16", "cpu", threads,
                f"key_block={rowplan.KEY_BLOCK},forward=rowdecoder,lm={_lm_head()},quantize={quantize},isa={isa},"
                f"kernels={native.build_id()}")


def _lm_head() -> str:
    """How greedy passes read lm_head (kernels/lmchoice.py): it changes a pass's cost."""
    from codespec.kernels import lmchoice

    return "screen" if lmchoice.wanted() else "full"


def _key(config: Any, source: str, dtype: str, device: Any, threads: int, layout: str) -> dict[str, str]:
    """The fields every profile key holds: machine, model, setting and kernel layout."""
    shapes = {name: getattr(config, name, None) for name in SHAPE_FIELDS}
    return {
        "processor": _processor(device),
        "machine": platform.machine(),
        "model": source,
        "model_shapes": _digest(json.dumps(shapes, sort_keys=True, default=str)),
        "dtype": dtype,
        "device": str(device),
        "threads": str(threads),
        "layout": layout,
        "env": ",".join(f"{name}={value}" for name, value in environment_switches(KERNEL_ENV).items()),
    }


def profile_path(cache_dir: Path | str, key: dict[str, str]) -> Path:
    """`<cache_dir>/calibration/<model>-<dtype>-<16 hex digits of the key's hash>.json`."""
    name = Path(key.get("model", "model")).name or "model"
    slug = "".join(c if c.isalnum() or c in "._-" else "_" for c in name)[:48]
    return Path(cache_dir) / SUBDIR / f"{slug}-{key.get('dtype', '')}-{_digest(json.dumps(key, sort_keys=True))}.json"


def load(cache_dir: Path | str, key: dict[str, str]) -> Profile | None:
    """The stored profile for `key`; None when there is none, or it is unreadable or stale
    (then the next `save` replaces it)."""
    path = profile_path(cache_dir, key)
    try:
        profile = Profile.from_json(json.loads(path.read_text(encoding="utf-8")))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("ignoring the machine profile %s (%s); it will be rebuilt", path, exc)
        return None
    if profile.key != key:
        log.warning("ignoring the machine profile %s: it was measured under another setting", path)
        return None
    return profile


def save(cache_dir: Path | str, profile: Profile) -> Path | None:
    """Write `profile` atomically; returns its path, or None (with a warning) when the
    cache directory is not writable: a profile is an optimisation, never a failure."""
    path = profile_path(cache_dir, profile.key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=f".{path.stem}-", suffix=".tmp",
                                         delete=False, encoding="utf-8") as tmp:
            json.dump(profile.to_json(), tmp, indent=1)
        os.replace(tmp.name, path)
    except OSError as exc:
        log.warning("could not store the machine profile in %s: %s", path.parent, exc)
        return None
    return path


@dataclass(frozen=True)
class Cpu:
    """The CPU as /proc/cpuinfo names it: its model name, its x86 family and model numbers
    (a VM may name only the vendor: "AMD EPYC" with family 26 model 2 is a Zen 5) and its
    feature flags. Kernel choices differ between CPU kinds of one architecture (AMX,
    AVX-512 BF16, AVX2 alone), so results name them."""

    name: str
    generation: str  # "family 26 model 2", or "" where cpuinfo gives none (Arm)
    flags: frozenset[str]


def cpu_description(cpuinfo: str = "/proc/cpuinfo") -> Cpu:
    """This machine's CPU (the name from `platform`, no flags, where cpuinfo cannot be read).

    >>> cpu = cpu_description()
    >>> isinstance(cpu.name, str) and bool(cpu.name) and isinstance(cpu.flags, frozenset)
    True
    """
    fields: dict[str, str] = {}
    try:
        with open(cpuinfo, encoding="utf-8") as f:
            for line in f:
                label, _, value = line.partition(":")
                fields.setdefault(label.strip(), value.strip())  # the first processor's
    except OSError:
        pass
    family, model = fields.get("cpu family", ""), fields.get("model", "")
    return Cpu(fields.get("model name") or platform.processor() or platform.machine(),
               f"family {family} model {model}" if family and model else "",
               frozenset((fields.get("flags") or fields.get("Features") or "").split()))


def _processor(device: Any) -> str:
    if str(device).startswith("cuda"):
        import torch

        return f"cuda:{torch.cuda.get_device_name(device)}"
    cpu = cpu_description()
    return f"{cpu.name}|{_digest(' '.join(sorted(cpu.flags)))}" if cpu.flags else cpu.name


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
