"""The CUDA backend's step between the q/k/v product and attention, in one launch:
rotary on q and k, and each row's K and V stored in its KV slot (forward/cuda/forward.py).

As a torch.compile'd function with `index_copy_` this took five kernels a layer on the
H100 (the rotary, the stores, and copies functionalization added); as two index_copy_
launches beside inductor's rotary, four. Rotary rounds in the model's dtype after each
product and after the sum, as transformers' eager code does. Exactness does not rest on
matching the eager prefill's bits (every pass and step stores its K here); whether it
matches on a device was checked on an H100 (2026-11-26: not the same bits); compiling for
sm_90 offline found why: Triton fused `x * cos` into the sum as one bf16 fma, the product
never rounded. The kernel launches with fused multiply-adds off (_rope_store.ROPE_FP_FUSION).

Padding rows store their `source` row's K and V (the same values to the same place).

>>> rows, heads, kv_heads, dim = 2, 2, 1, 4
>>> qkv = torch.randn(rows, (heads + 2 * kv_heads) * dim)
>>> cos, sin = torch.ones(rows, dim), torch.zeros(rows, dim)      # position 0: no rotation
>>> keys, values = torch.zeros(1, kv_heads, 8, dim), torch.zeros(1, kv_heads, 8, dim)
>>> q = rope_store(qkv, cos, sin, torch.tensor([0, 1]), torch.tensor([0, 0]), torch.tensor([3, 4]),
...                keys, values, heads=heads, kv_heads=kv_heads)
>>> torch.equal(q.reshape(rows, -1), qkv[:, :heads * dim]) and torch.equal(values[0, 0, 4], qkv[1, -dim:])
True
"""

from __future__ import annotations

import torch

from codespec.kernels import check, check_live, use_triton


def rope_store(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, source: torch.Tensor,
               write_slots: torch.Tensor, write_positions: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, *,
               heads: int, kv_heads: int, positions: torch.Tensor | None = None, out: torch.Tensor | None = None,
               live: tuple[torch.Tensor, torch.Tensor] | None = None, pdl: bool = False,
               force_triton: bool | None = None) -> torch.Tensor:
    """q [rows, heads, dim] after rotary; row r's K and V go to
    keys/values[write_slots[r], :, write_positions[r]] (taken from row source[r]). cos and
    sin are [rows, dim], row r's own; or, with `positions` [rows], tables [P, dim] that
    row r reads at positions[r] (the cuda backend's: no rotary kernels in a pass).
    `live` (the pass's context and path_len): the kernel skips rows that hold no token
    (padding: their store would repeat their source row's, their q is left undefined);
    the reference computes every row. `pdl`: launched as a programmatic dependent on CUDA
    (forward/cuda/_pdl.py)."""
    rows = qkv.shape[0]
    dim = keys.shape[3]
    check(qkv.dim() == 2 and qkv.shape[1] == (heads + 2 * kv_heads) * dim and qkv.stride(1) == 1,
          "qkv must be [rows, (heads + 2 * kv_heads) * dim], contiguous in its last dimension")
    check(cos.shape == ((rows, dim) if positions is None else (cos.shape[0], dim)) and sin.shape == cos.shape
          and cos.stride() == sin.stride() and cos.stride(1) == 1,
          "cos and sin must be [rows, dim] (tables [P, dim] with positions) of one layout")
    check(positions is None or (positions.shape == (rows,) and positions.device == qkv.device),
          "positions must be [rows]")
    check(keys.shape == values.shape and keys.stride() == values.stride() and keys.shape[1] == kv_heads
          and keys.stride(3) == 1, "keys and values must be [slots, kv_heads, positions, dim] of one layout")
    for t in (source, write_slots, write_positions):
        check(t.shape == (rows,) and t.device == qkv.device, "source, write_slots, write_positions must be [rows]")
    if out is None:
        out = torch.empty(rows, heads, dim, dtype=qkv.dtype, device=qkv.device)
    check(out.shape == (rows, heads, dim) and out.stride(2) == 1, "out must be [rows, heads, dim]")
    check_live(live, qkv)
    if use_triton(qkv, force_triton):
        from codespec.forward.cuda import _rope_store

        _rope_store.rope_store(qkv, cos, sin, positions, source, write_slots, write_positions, keys, values, out, heads,
                           kv_heads, live, pdl and qkv.is_cuda)
    else:
        if positions is not None:
            cos, sin = cos.index_select(0, positions), sin.index_select(0, positions)
        q, k, v = rope_store_ref(qkv, cos, sin, heads, kv_heads, dim)
        out.copy_(q)
        keys[write_slots, :, write_positions] = k.index_select(0, source)
        values[write_slots, :, write_positions] = v.index_select(0, source)
    return out


def rope_store_ref(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int, kv_heads: int,
                   dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k [rows, heads or kv_heads, dim] after rotary, and v: transformers' arithmetic."""
    rows = qkv.shape[0]
    q, k, v = qkv.split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
    q, k, v = q.reshape(rows, heads, dim), k.reshape(rows, kv_heads, dim), v.reshape(rows, kv_heads, dim)
    cos, sin = cos[:, None, :], sin[:, None, :]
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin, v


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
