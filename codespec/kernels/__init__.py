"""Kernels, each beside a reference of the same op; no policy, no model loading.

C, built by the system's gcc on first use (native.py) and driven through ctypes, no torch:
* `rowgemm`: the row-exact bf16 product (every output one dot product in a fixed order);
* `rowdecoder.c`: a Qwen2/Llama decoder stack for every row of a pass in one call;
* `int8`: int8 weights and their row-exact products; `lmchoice`: the exact greedy choice
  through lm_head's int8 screen.
Triton, for CUDA tensors (`_triton.py`, imported only when a kernel runs; tests run them
on CPU under `TRITON_INTERPRET=1`), each module a wrapper that checks shapes, dtypes and
contiguity, and `<op>_ref` in plain torch that CPU tensors use:
* `compact.compact_kv`: move each request's accepted path to be contiguous in its KV slot.
The cuda backend's own kernels (row attention, rotary and the KV store) live with it in
codespec/forward/cuda/.
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


def check_live(live: tuple[torch.Tensor, torch.Tensor] | None, like: torch.Tensor) -> None:
    """A kernel's `live` rows: None, or the pass's (context, path_len), one per row of `like`."""
    check(live is None or all(t.shape == (like.shape[0],) and t.device == like.device for t in live),
          "live must be (context, path_len), one per row each, on the input's device")
