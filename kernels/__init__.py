"""Triton kernels for the verifier, each beside a plain-torch reference of the same op.

* `accept.tree_accept`: greedy acceptance over a batch of draft trees (argmax per row,
  compare with each node's token, the longest accepted path, the bonus token);
* `compact.compact_kv`: move each request's accepted path to be contiguous in its KV slot;
* `tree_mask.tree_mask`: the ancestor-or-self mask of a batch of trees.

Each module holds the wrapper (checks shapes, dtypes and contiguity, then dispatches),
and `<op>_ref` in plain torch. CUDA tensors use the Triton kernels in `_triton.py`, CPU
tensors the references; `_triton.py` imports triton, so it is only imported when a
kernel runs (tests run it on CPU under `TRITON_INTERPRET=1`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the package itself needs no torch: native.py serves the torch-free path
    import torch


def use_triton(tensor: torch.Tensor, force: bool | None) -> bool:
    """The kernel runs for CUDA tensors (or when a test forces it); else the reference."""
    return tensor.is_cuda if force is None else force


def check(condition: bool, message: str) -> None:
    """Wrapper argument checks: a kernel fed a bad shape would read out of bounds."""
    if not condition:
        raise ValueError(message)
