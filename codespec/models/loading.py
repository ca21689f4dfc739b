"""Resolve a `--model` argument to a directory and load it for the engine.

>>> # resolve_model_path("default", settings)   -> the prepared default model directory
>>> # resolve_model_path("~/models/my-coder", settings) -> that directory, checked
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from codespec.errors import ModelError
from codespec.models import default
from codespec.models.serving import quiet_transformers, serving_copy
from codespec.settings import Settings

if TYPE_CHECKING:
    import torch

# "org/name" with Hugging Face's allowed characters; anything else is a local path.
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def resolve_model_path(spec: str, settings: Settings, *, progress: bool = True) -> tuple[str, str]:
    """Return `(name, path_or_hub_id)` for a `--model` value, preparing a packaged model
    ("default", or a name `codespec model list` shows) if needed."""
    model = default.packaged(spec)
    if model is not None:
        path = default.prepare(settings.cache_dir, model, progress=progress)
        check_model_dir(path, model.name)
        return model.name, str(path)
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
    raise ModelError(f"--model {spec}: no such directory; pass 'default', {', '.join(default.PACKAGED)}, a model "
                     "directory or a hub id")


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
