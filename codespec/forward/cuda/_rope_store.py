"""The Triton kernel behind `rope_store` (forward/cuda/rope_store.py; imported only when it runs:
on CUDA tensors, or on CPU under `TRITON_INTERPRET=1` in the tests). The launcher takes
arguments its wrapper already checked."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from codespec.forward.cuda._pdl import launch_options, pdl_start, pdl_wait

# Rotary rounds where transformers' eager code rounds (_rope_store_head): no fused
# multiply-add may skip a rounding (forward/cuda/_pdl.py, launch_options).
ROPE_FP_FUSION = False


@triton.jit
def _holds_token(context_ptr, path_len_ptr, row, LIVE: tl.constexpr):
    # Whether a pass's row holds a token: it attends to something (context + path > 0; a
    # padding row attends to nothing, forward/cuda/passlayout.py), where the launch has
    # the pass's rows (LIVE); every row otherwise.
    if LIVE:
        return tl.load(context_ptr + row) + tl.load(path_len_ptr + row) > 0
    return tl.full(row.shape, 1, tl.int1)


@triton.jit
def _rope_store_kernel(qkv_ptr, cos_ptr, sin_ptr, positions_ptr, source_ptr, write_slot_ptr, write_position_ptr, q_ptr,
                       k_ptr, v_ptr, context_ptr, path_len_ptr, s_qkv, s_rope, s_q_row, s_q_head, s_kv_slot, s_kv_head,
                       s_kv_pos, HEADS: tl.constexpr, KV_HEADS: tl.constexpr, DIM: tl.constexpr, TABLES: tl.constexpr,
                       LIVE: tl.constexpr, PDL: tl.constexpr):
    # One program per (row, head of q, k or v). With LIVE, a row that holds no token
    # (context + path 0: padding) does nothing: its K and V would repeat its source row's
    # store, and its q is never read (no keys: attention writes zeros).
    pdl_start(PDL)
    pdl_wait(PDL)
    row = tl.program_id(0)
    head = tl.program_id(1)
    if _holds_token(context_ptr, path_len_ptr, row, LIVE):
        _rope_store_head(qkv_ptr, cos_ptr, sin_ptr, positions_ptr, source_ptr, write_slot_ptr, write_position_ptr,
                         q_ptr, k_ptr, v_ptr, row, head, s_qkv, s_rope, s_q_row, s_q_head, s_kv_slot, s_kv_head,
                         s_kv_pos, HEADS, KV_HEADS, DIM, TABLES)


@triton.jit
def rotary_rounded(x, rotated, cos, sin, dtype: tl.constexpr):
    # x * cos + rotate_half(x) * sin as transformers' eager code computes it in `dtype`:
    # each product rounded, then their sum (float32 operands; the launches pin fused
    # multiply-adds off, so no rounding is skipped). rope_store's and q/k/v's epilogue's.
    first = (x * cos).to(dtype).to(tl.float32)
    second = (rotated * sin).to(dtype).to(tl.float32)
    return (first + second).to(dtype)


@triton.jit
def _rope_store_head(qkv_ptr, cos_ptr, sin_ptr, positions_ptr, source_ptr, write_slot_ptr, write_position_ptr, q_ptr,
                     k_ptr, v_ptr, row, head, s_qkv, s_rope, s_q_row, s_q_head, s_kv_slot, s_kv_head, s_kv_pos,
                     HEADS: tl.constexpr, KV_HEADS: tl.constexpr, DIM: tl.constexpr, TABLES: tl.constexpr):
    # Rotary as transformers applies it in the model's dtype: x * cos and rotate_half(x) *
    # sin each rounded, then their sum rounded. TABLES: cos and sin are tables read at the
    # row's position, else the row's own.
    d = tl.arange(0, DIM)
    half = DIM // 2
    src = tl.where(head < HEADS, row, tl.load(source_ptr + row))  # padding rows store their source row's K, V
    base = qkv_ptr + src * s_qkv + head * DIM
    x = tl.load(base + d)
    if head < HEADS + KV_HEADS:
        partner = tl.load(base + (d + half) % DIM)
        rotated = tl.where(d < half, -partner.to(tl.float32), partner.to(tl.float32)).to(x.dtype)
        at = src
        if TABLES:
            at = tl.load(positions_ptr + src)
        cos = tl.load(cos_ptr + at * s_rope + d)
        sin = tl.load(sin_ptr + at * s_rope + d)
        x = rotary_rounded(x.to(tl.float32), rotated.to(tl.float32), cos.to(tl.float32), sin.to(tl.float32),
                           x.dtype)
    if head < HEADS:
        tl.store(q_ptr + row * s_q_row + head * s_q_head + d, x)
    else:
        kv_head = (head - HEADS) % KV_HEADS
        at = tl.load(write_slot_ptr + row) * s_kv_slot + kv_head * s_kv_head + tl.load(write_position_ptr + row) * s_kv_pos
        if head < HEADS + KV_HEADS:
            tl.store(k_ptr + at + d, x)
        else:
            tl.store(v_ptr + at + d, x)


def rope_store(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor | None,
               source: torch.Tensor, write_slots: torch.Tensor, write_positions: torch.Tensor, keys: torch.Tensor,
               values: torch.Tensor, q: torch.Tensor, heads: int, kv_heads: int,
               live: tuple[torch.Tensor, torch.Tensor] | None = None, pdl: bool = False) -> None:
    rows, dim = q.shape[0], q.shape[2]
    context, path_len = live if live is not None else (source, source)
    # one warp a program: a head is DIM (64) values
    _rope_store_kernel[(rows, heads + 2 * kv_heads)](
        qkv, cos, sin, positions if positions is not None else source, source, write_slots, write_positions, q, keys,
        values, context, path_len, qkv.stride(0), cos.stride(0), q.stride(0), q.stride(1), keys.stride(0),
        keys.stride(1), keys.stride(2), HEADS=heads, KV_HEADS=kv_heads, DIM=dim, TABLES=positions is not None,
        LIVE=live is not None, PDL=pdl, num_warps=1,
        **launch_options(pdl, fp_fusion=ROPE_FP_FUSION))
