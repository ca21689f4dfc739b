"""Resolve a `--model` argument to a directory and load it for the engine.

>>> # resolve_model_path("default", settings)   -> the prepared default model directory
>>> # resolve_model_path("~/models/my-coder", settings) -> that directory, checked
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from codespec.errors import ModelError
from codespec.models import default
from codespec.settings import Settings, no_advisory_warnings

if TYPE_CHECKING:
    import torch

# "org/name" with Hugging Face's allowed characters; anything else is a local path.
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
SERVING_COPY = "codespec-serving.json"  # marks a complete copy of the weights in a serving dtype


def resolve_model_path(spec: str, settings: Settings, *, progress: bool = True) -> tuple[str, str]:
    """Return `(name, path_or_hub_id)` for a `--model` value, preparing the default if needed."""
    if spec in ("", "default"):
        path = default.prepare(settings.cache_dir, progress=progress)
        check_model_dir(path, "the default model")
        return default.DEFAULT_MODEL.name, str(path)
    local = Path(os.path.expanduser(spec))
    if local.exists():
        if not local.is_dir():
            raise ModelError(f"--model {spec}: not a directory; pass a Hugging Face model directory")
        if not (local / "config.json").is_file():
            raise ModelError(
                f"--model {spec}: no config.json there; pass a Hugging Face model directory "
                "(one that transformers' from_pretrained loads)"
            )
        check_model_dir(local, f"--model {spec}")
        return local.resolve().name, str(local.resolve())
    if _HUB_ID.match(spec):
        return spec, spec  # transformers resolves it, from its local cache or a reachable hub
    raise ModelError(f"--model {spec}: no such directory; pass 'default', a model directory or a hub id")


def pick_device(setting: str) -> torch.device:
    import torch

    if setting == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if setting == "cuda" and not torch.cuda.is_available():
        raise ModelError("--device cuda: no CUDA device is visible; use --device cpu")
    return torch.device(setting)


def pick_dtype(setting: str, device: torch.device) -> torch.dtype:
    import torch

    if setting == "auto":
        # bfloat16 on both: on this project's reference CPU (AVX512-BF16) a verify pass
        # over 8-16 tokens costs 1.6-2.1x a decode step in bf16 against 2.6-2.7x in fp32.
        return torch.bfloat16
    return getattr(torch, setting)


def set_threads(threads: int) -> None:
    import torch

    if threads > 0:
        torch.set_num_threads(threads)
    elif hasattr(os, "sched_getaffinity"):
        torch.set_num_threads(max(1, len(os.sched_getaffinity(0))))


def quiet_transformers() -> None:
    """transformers' own warnings and weight-loading bars would drown our output (called
    where transformers is imported: a process that never loads it never pays its import)."""
    no_advisory_warnings()
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def check_model_dir(path: Path | str, what: str) -> None:
    """One clear line for a model directory that cannot load: a config.json that is not
    a JSON object, a safetensors file whose header is garbage or whose data is cut short
    (a copy that stopped early). Reads headers only, not the weights."""
    path = Path(path)
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ModelError(f"{what}: {path / 'config.json'} is not readable JSON ({exc}); restore it") from None
    if not isinstance(config, dict) or not isinstance(config.get("model_type", ""), str):
        raise ModelError(f"{what}: {path / 'config.json'} is not a model configuration (a JSON object with "
                         "model_type); restore it")
    for weights in sorted(path.glob("*.safetensors")):
        problem = safetensors_damage(weights)
        if problem:
            raise ModelError(f"{what}: {weights} {problem}; copy or prepare the model again")


def safetensors_damage(path: Path) -> str | None:
    """What is wrong with a safetensors file's framing (None: its header parses and its
    size covers every tensor it lists)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            return f"is truncated ({size} bytes)"
        length = int.from_bytes(prefix, "little")
        if length > min(size - 8, 100 << 20):
            return f"has a broken header (it claims {length} bytes)"
        try:
            header = json.loads(f.read(length))
            ends = [int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__"]
        except (UnicodeDecodeError, ValueError, KeyError, TypeError, IndexError, AttributeError):
            return "has a broken header"
    needed = 8 + length + max(ends, default=0)
    if size < needed:
        return f"is truncated ({size} bytes, its tensors need {needed})"
    return None


def load_transformers(settings: Settings, name: str, path: str) -> tuple[Any, Any, str]:
    """(model, tokenizer, weights directory): transformers' model that `path` holds, in
    eval mode on the device and dtype `settings` pick (forward/select.py decides when)."""
    quiet_transformers()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = pick_device(settings.device)
    dtype = pick_dtype(settings.dtype, device)
    set_threads(settings.threads)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        weights = serving_copy(path, dtype)
        model = AutoModelForCausalLM.from_pretrained(weights, dtype=dtype, attn_implementation="sdpa")
    except (OSError, ValueError) as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(f"cannot load model {settings.model!r} from {path}: {first_line}") from exc
    model.to(device).eval()
    return model, tokenizer, weights


def serving_copy(path: str, dtype: torch.dtype) -> str:
    """The directory to load `path`'s weights from in `dtype`: its copy in that dtype when
    one was written (`write_serving_copy`), else `path` itself."""
    copy = Path(path) / _dtype_name(dtype)
    return str(copy) if (copy / SERVING_COPY).is_file() else path


def write_serving_copy(path: str | Path, dtype: torch.dtype) -> Path:
    """Save `path`'s weights converted to `dtype` into `path/<dtype>/`, once (atomically).

    Why: the default model is cached in float32 (exact dequantised values) and served in
    bfloat16; converting on every load read 2.5 GB and cast it (0.8 s warm, seconds with
    a cold page cache), where the bfloat16 copy is half the bytes and loads as is. The
    copy is made by the very load it replaces (`from_pretrained(path, dtype=...)`), so
    its weights are bit for bit what that load gives."""
    quiet_transformers()
    from transformers import AutoModelForCausalLM

    copy = Path(path) / _dtype_name(dtype)
    if (copy / SERVING_COPY).is_file():
        return copy
    config = json.loads((Path(path) / "config.json").read_text())
    if (config.get("dtype") or config.get("torch_dtype")) == _dtype_name(dtype):
        return Path(path)  # stored in that dtype already
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    with tempfile.TemporaryDirectory(prefix=f".{copy.name}-", dir=path) as tmp:
        work = Path(tmp) / "copy"
        model.save_pretrained(work)
        (work / SERVING_COPY).write_text(json.dumps({"dtype": _dtype_name(dtype), "source": str(path)}))
        if copy.exists():  # an incomplete leftover (no marker): replace it
            shutil.rmtree(copy)
        os.replace(work, copy)
    return copy


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def load_tokenizer(settings: Settings, *, progress: bool = True) -> Any:
    """The tokenizer of `settings.model` alone (indexing needs no weights)."""
    quiet_transformers()
    from transformers import AutoTokenizer

    _, path = resolve_model_path(settings.model, settings, progress=progress)
    try:
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot load the tokenizer of {settings.model!r} from {path}: {exc}") from exc


def read_manifest(path: str) -> dict[str, Any] | None:
    manifest = Path(path) / default.MANIFEST
    return json.loads(manifest.read_text()) if manifest.is_file() else None
