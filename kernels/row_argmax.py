"""The greedy choice of the rows that hold a token, in two launches (the cuda backend's
`CODESPEC_CUDA_ARGMAX=rows`; forward/cuda.py).

Why. A pass's logits are [64, 151,936] for the default model whatever it holds (the
bucket), 19 MB in bf16; torch.argmax reads all of it, ~0.02 ms of a ~1.3 ms H100 step
(session 20's profile), for one real row in a plain step. Here a row with no keys (a
padding row: context 0, path 0) is skipped: its choice is never read (0 is written).
A real row's choice is torch.argmax's: the first index of the largest value, and a NaN
counts as the largest (the first NaN).

>>> logits = torch.tensor([[0.5, 2.0, 2.0], [9.0, 1.0, 0.0], [1.0, float("nan"), 3.0]])
>>> row_argmax(logits, torch.tensor([4, 0, 1]), torch.tensor([0, 0, 0])).tolist()   # row 1: padding
[1, 0, 1]
"""

from __future__ import annotations

import torch

from codespec.kernels import check, use_triton

SPLITS = 64  # programs per row along the vocabulary (a power of two: the final reduce's width)
BLOCK = 1024  # logits a program reads at a time


def row_argmax(logits: torch.Tensor, context: torch.Tensor, path_len: torch.Tensor, *,
               out: torch.Tensor | None = None, pdl: bool = False, force_triton: bool | None = None) -> torch.Tensor:
    """[rows] int64: each row's greedy choice, 0 for rows without keys (module docstring).
    `pdl`: launched as programmatic dependents on CUDA (kernels/_triton_pdl.py)."""
    rows = logits.shape[0]
    check(logits.dim() == 2 and logits.stride(1) == 1, "logits must be [rows, vocab], contiguous in vocab")
    check(context.shape == (rows,) and path_len.shape == (rows,), "context and path_len must be [rows]")
    if out is None:
        out = torch.empty(rows, dtype=torch.int64, device=logits.device)
    if use_triton(logits, force_triton):
        from codespec.kernels import _triton

        _triton.row_argmax(logits, context, path_len, out, SPLITS, BLOCK, pdl and logits.is_cuda)
    else:
        out.copy_(row_argmax_ref(logits, context, path_len))
    return out


def row_argmax_ref(logits: torch.Tensor, context: torch.Tensor, path_len: torch.Tensor) -> torch.Tensor:
    return torch.where(context + path_len > 0, torch.argmax(logits, dim=-1), 0)
