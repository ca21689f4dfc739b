"""The torch-free load: a model straight from its files to the `rowdecoder` backend.

A fresh process that imports torch and transformers spends ~2 s on it before its first
token, and a server keeps a second copy of the weights in memory. Where the
row decoder serves the model anyway (CPU with AVX-512 BF16, bfloat16, a Qwen2/Llama
model with the default rotary embedding, weights stored in bfloat16) nothing of torch is
needed: the weights come from the safetensors files (weights.py), the tokenizer from
`tokenizers` (tokenizer.py), the KV slots are numpy arrays, and every pass is the C
forward's (rows.py). It computes what the same backend computes over a transformers
model's weights (hf_weights.py), bit for bit (tests/test_direct.py pins that).

    reason = unsupported(path, settings)            # None: this load applies
    forward, tokenizer, weights = load(path, settings)   # ~0.6 s for the default model

select.py decides when it is used (everything but `codespec bench`, which also needs
transformers' model for its peers). Greedy requests never import torch; a sampled one
imports it for the acceptance rule (verify/sampling.py).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from codespec.forward import profile, rowdecoder
from codespec.forward.rows import RowForward
from codespec.kernels import native, rowgemm


def _config(path: Path, name: str) -> SimpleNamespace:
    file = path / name
    return SimpleNamespace(**json.loads(file.read_text())) if file.is_file() else SimpleNamespace()


def _cuda_visible() -> bool:
    """Whether `--device auto` would pick a GPU, told without importing torch: an NVIDIA
    device node and a torch build that is not CPU-only."""
    if not os.path.exists("/dev/nvidiactl"):
        return False
    from importlib import metadata

    try:
        return "+cpu" not in metadata.version("torch")
    except metadata.PackageNotFoundError:
        return False


def unsupported(path: str | Path, settings: Any, *, portable: bool = False) -> str | None:
    """Why the torch-free load cannot serve the model at `path` under `settings` (None: it
    can). `portable`: a CPU without AVX-512 BF16 runs the C forward's portable code."""
    path = Path(path)
    if settings.device == "cuda" or (settings.device == "auto" and _cuda_visible()):
        return "the model runs on CUDA"
    if settings.device not in ("auto", "cpu") or settings.dtype not in ("auto", "bfloat16"):
        return f"device {settings.device}, dtype {settings.dtype} (the C forward is CPU bfloat16)"
    if not (path / "config.json").is_file() or not (path / "tokenizer.json").is_file():
        return "no config.json or tokenizer.json"
    config = _config(path, "config.json")
    reason = rowdecoder.config_unsupported(config)
    if reason is None and rowdecoder.rope_type(config) != "default":
        reason = "a scaled rotary embedding"
    if reason is not None:
        return reason
    from codespec.forward import weights

    if weights.dtypes(_weights_dir(path)) != {"BF16"}:
        return "weights not stored in bfloat16"
    if not native.has("rowdecoder_forward") or rowgemm.library() is None:
        return f"the C forward is not built ({native.unavailable() or 'no rowdecoder'})"
    if rowgemm.isa() == rowgemm.SCALAR and not portable:
        return "this CPU has neither AVX-512 BF16 nor AVX2 with FMA"
    return None


def _weights_dir(path: Path) -> Path:
    """The bfloat16 serving copy `model prepare` writes (models/loading.py), else `path`."""
    from codespec.models.serving import SERVING_COPY

    copy = path / "bfloat16"
    return copy if (copy / SERVING_COPY).is_file() else path


def _threads(settings: Any) -> int:
    if settings.threads > 0:
        return settings.threads
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def load(path: str | Path, settings: Any, *, portable: bool = False) -> tuple[RowForward, Any, Path]:
    """(the backend, the tokenizer, the weights' directory) of the model at `path`: its
    safetensors mapped and packed for the C forward, `tokenizer.json` read by `tokenizers`
    (call `unsupported` first)."""
    from codespec.forward import weights
    from codespec.forward.tokenizer import DirectTokenizer

    path = Path(path)
    threads = _threads(settings)
    lib = rowgemm.library()  # built (or found) by unsupported()
    lib.rowdecoder_threads(threads)
    source = _weights_dir(path)
    config = _config(source, "config.json")
    isa = rowgemm.isa()  # unsupported() refused the portable code unless asked for
    decoder = rowdecoder.RowDecoder(lib, isa, config, weights.load_weights(source, config),
                                    quantize=settings.quantize)
    key = profile.rows_key(config, str(path), threads, settings.quantize, isa)
    forward = RowForward(decoder, config, _config(source, "generation_config.json"), key)
    return forward, DirectTokenizer(path), source


