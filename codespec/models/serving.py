"""The copy of a model's weights in the dtype it is served in, and transformers kept quiet
while it loads (shared by loading.py and default.py, which prepares the default model)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from codespec.settings import no_advisory_warnings

if TYPE_CHECKING:
    import torch

SERVING_COPY = "codespec-serving.json"  # marks a complete copy of the weights in a serving dtype


def quiet_transformers() -> None:
    """transformers' own warnings and weight-loading bars would drown our output (called
    where transformers is imported: a process that never loads it never pays its import)."""
    no_advisory_warnings()
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


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
