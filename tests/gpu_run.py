"""What the GPU check's CPU tests share (tests/test_gpu_*.py): scripts/ on the path, and
a run as gpu_check's `load` hands it to its stages, on a tiny model."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import torch

from codespec.forward.cuda import CudaForward
from codespec.models.tiny import tiny_model

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
if str(SCRIPTS) not in sys.path:
    sys.path.insert(0, str(SCRIPTS))


def tiny_run(rows: int, vocab_size: int = 64, **extra) -> types.SimpleNamespace:
    """What gpu_check's `load` hands its stages (the model, its cuda backend, no
    tokenizer), on a tiny float32 model: the backend runs the kernels' references."""
    model = tiny_model("qwen2", vocab_size=vocab_size, seed=3, dtype=torch.float32)
    return types.SimpleNamespace(model=model, forward=CudaForward(model, rows=rows), tokenizer=None, **extra)
