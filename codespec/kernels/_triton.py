"""The Triton kernel behind `compact` (imported only when it runs: on
CUDA tensors, or on CPU under `TRITON_INTERPRET=1` in the tests).

Each launcher takes arguments its wrapper already checked."""

from __future__ import annotations

import torch
import triton
import triton.language as tl



@triton.jit
def _compact_kernel(kv_ptr, slots_ptr, starts_ptr, src_ptr, n_keep_ptr, heads, max_keep,
                    s_slot, s_head, s_token, head_dim, BLOCK_D: tl.constexpr):
    pid = tl.program_id(0)  # one program per (request, head); ascending j keeps it in place
    b = pid // heads
    h = pid % heads
    slot = tl.load(slots_ptr + b)
    start = tl.load(starts_ptr + b)
    n = tl.load(n_keep_ptr + b)
    dims = tl.arange(0, BLOCK_D)
    base = kv_ptr + slot * s_slot + h * s_head
    for j in range(0, n):
        src = tl.load(src_ptr + b * max_keep + j)
        if src != j:
            row = tl.load(base + (start + src) * s_token + dims, mask=dims < head_dim)
            tl.store(base + (start + j) * s_token + dims, row, mask=dims < head_dim)


def compact_kv(kv: torch.Tensor, slots: torch.Tensor, starts: torch.Tensor, src: torch.Tensor,
               n_keep: torch.Tensor) -> None:
    _, heads, _, head_dim = kv.shape
    grid = (slots.shape[0] * heads,)
    _compact_kernel[grid](kv, slots, starts, src, n_keep, heads, src.shape[1],
                          kv.stride(0), kv.stride(1), kv.stride(2), head_dim,
                          BLOCK_D=triton.next_power_of_2(head_dim))
