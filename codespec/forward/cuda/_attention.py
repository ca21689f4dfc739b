"""The Triton kernels behind `row_attention` (forward/cuda/attention.py; imported only when
one runs: on CUDA tensors, or on CPU under `TRITON_INTERPRET=1` in the tests).

Two launches. The first is a wave of programs (two per SM, 4 warps each) sharing the
pass's (row, key block, KV head) items, item i going to program i mod programs; padding
rows have no blocks, so they add no work (a one-row step over 512 keys is 8 items). Each
item writes its block's softmax partial (max score, sum of weights, weighted values) in
float32. The second combines a row's partials in block order, CHUNK at a time, one
program per (row, query head). A block is KEY_BLOCK *logical* keys, so what it holds and
how it is summed depend on the row's keys alone.

The launcher takes arguments its wrapper already checked."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from codespec.forward.cuda._pdl import launch_options, pdl_start, pdl_wait


@triton.jit
def _query_group(q_ptr, row, kv_head, s_q_row, s_q_head, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
                 DIM: tl.constexpr):
    # The GROUP query heads of `row` that share `kv_head`, padded to GROUP_PAD rows (tl.dot
    # needs 16). Operands in float32: a bf16 or fp16 value is exact in tf32, so tf32
    # products of them are exact too (the weights round to tf32, finer than bf16).
    g = tl.arange(0, GROUP_PAD)
    head = kv_head * GROUP + g
    return tl.load(q_ptr + row * s_q_row + head[:, None] * s_q_head + tl.arange(0, DIM)[None, :],
                   mask=(g < GROUP)[:, None], other=0.0).to(tl.float32)


@triton.jit
def _block_partial(q, k_ptr, v_ptr, part_ptr, path_ptr, row, kv_head, slot, context, total, block, scale,
                   s_kv_slot, s_kv_head, s_kv_pos, s_path, s_part_row, s_part_head, s_part_block,
                   GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, DIM: tl.constexpr, KEY_BLOCK: tl.constexpr,
                   PRECISION: tl.constexpr):
    # One key block's softmax partial for a row's query group, written apart. The block's
    # KEY_BLOCK logical keys: the context's positions, then the path's.
    d = tl.arange(0, DIM)
    t = block * KEY_BLOCK + tl.arange(0, KEY_BLOCK)
    inside = t < total
    on_path = t >= context
    step = tl.load(path_ptr + row * s_path + (t - context), mask=inside & on_path, other=0)
    position = tl.where(on_path, step, t)
    offsets = slot * s_kv_slot + kv_head * s_kv_head + position[:, None] * s_kv_pos + d[None, :]
    k = tl.load(k_ptr + offsets, mask=inside[:, None], other=0.0).to(tl.float32)
    v = tl.load(v_ptr + offsets, mask=inside[:, None], other=0.0).to(tl.float32)
    g = tl.arange(0, GROUP_PAD)
    head = kv_head * GROUP + g
    real = g < GROUP
    scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
    scores = tl.where(inside[None, :], scores, float("-inf"))
    best = tl.max(scores, axis=1)  # finite: the block holds at least one key
    weights = tl.exp(scores - best[:, None])
    values = tl.dot(weights, v, input_precision=PRECISION)
    at = part_ptr + row * s_part_row + head * s_part_head + block * s_part_block  # [GROUP_PAD]: max, sum, values
    tl.store(at, best, mask=real)
    tl.store(at + 1, tl.sum(weights, axis=1), mask=real)
    tl.store(at[:, None] + 2 + d[None, :], values, mask=real[:, None])


@triton.jit
def _row_attention_work_kernel(q_ptr, k_ptr, v_ptr, part_ptr, slots_ptr, context_ptr, path_ptr, path_len_ptr,
                               scale, rows, s_q_row, s_q_head, s_kv_slot, s_kv_head, s_kv_pos, s_path,
                               s_part_row, s_part_head, s_part_block, KV_HEADS: tl.constexpr,
                               ROWS_PAD: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
                               DIM: tl.constexpr, KEY_BLOCK: tl.constexpr, PRECISION: tl.constexpr,
                               PDL: tl.constexpr):
    pdl_start(PDL)
    pdl_wait(PDL)
    # each row's key blocks (0 past the pass's rows and for padding rows), and where each
    # row's blocks end in the pass's flat list of blocks
    r = tl.arange(0, ROWS_PAD)
    listed = r < rows
    blocks = tl.cdiv(tl.load(context_ptr + r, mask=listed, other=0) + tl.load(path_len_ptr + r, mask=listed, other=0),
                     KEY_BLOCK)
    ends = tl.cumsum(blocks, axis=0)
    for item in range(tl.program_id(0), tl.sum(blocks, axis=0) * KV_HEADS, tl.num_programs(0)):
        kv_head = item % KV_HEADS
        flat = item // KV_HEADS
        row = tl.sum((ends <= flat).to(tl.int32), axis=0)  # the rows whose blocks all come before
        block = flat - tl.sum(tl.where(r < row, blocks, 0), axis=0)
        slot = tl.load(slots_ptr + row)
        context = tl.load(context_ptr + row)
        total = context + tl.load(path_len_ptr + row)
        q = _query_group(q_ptr, row, kv_head, s_q_row, s_q_head, GROUP, GROUP_PAD, DIM)
        _block_partial(q, k_ptr, v_ptr, part_ptr, path_ptr, row, kv_head, slot, context, total, block, scale,
                       s_kv_slot, s_kv_head, s_kv_pos, s_path, s_part_row, s_part_head, s_part_block,
                       GROUP, GROUP_PAD, DIM, KEY_BLOCK, PRECISION)


@triton.jit
def _row_attention_combine_kernel(out_ptr, part_ptr, context_ptr, path_len_ptr, s_out_row, s_out_head,
                                  s_part_row, s_part_head, s_part_block, DIM: tl.constexpr, KEY_BLOCK: tl.constexpr,
                                  CHUNK: tl.constexpr, PDL: tl.constexpr):
    # One program per (row, query head): its block partials in block order, CHUNK at a
    # time (a fixed tree within a chunk, chunks in order): the row's keys fix the order.
    pdl_start(PDL)
    pdl_wait(PDL)
    row = tl.program_id(0)
    head = tl.program_id(1)
    blocks = tl.cdiv(tl.load(context_ptr + row) + tl.load(path_len_ptr + row), KEY_BLOCK)
    part = part_ptr + row * s_part_row + head * s_part_head
    c = tl.arange(0, CHUNK)
    d = tl.arange(0, DIM)
    best = tl.full([CHUNK], float("-inf"), tl.float32)
    for first in range(0, blocks, CHUNK):
        best = tl.maximum(best, tl.load(part + (first + c) * s_part_block, mask=first + c < blocks,
                                        other=float("-inf")))
    top = tl.max(best, axis=0)  # a maximum is the same in any order
    total_weight = tl.zeros([CHUNK], tl.float32)
    acc = tl.zeros([DIM], tl.float32)
    for first in range(0, blocks, CHUNK):
        inside = first + c < blocks
        at = part + (first + c) * s_part_block
        rescale = tl.where(inside, tl.exp(tl.load(at, mask=inside, other=0.0) - top), 0.0)
        total_weight += rescale * tl.load(at + 1, mask=inside, other=0.0)
        values = tl.load(at[:, None] + 2 + d[None, :], mask=inside[:, None], other=0.0)
        acc += tl.sum(rescale[:, None] * values, axis=0)
    weight = tl.sum(total_weight, axis=0)
    result = acc / tl.where(weight > 0, weight, 1.0)  # no keys (padding): zeros
    tl.store(out_ptr + row * s_out_row + head * s_out_head + d, result.to(out_ptr.dtype.element_ty))


def row_attention(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, slots: torch.Tensor,
                  context: torch.Tensor, path: torch.Tensor, path_len: torch.Tensor, scale: float,
                  out: torch.Tensor, key_block: int, programs: int, work_warps: int, pdl: bool = False) -> None:
    rows, heads, dim = query.shape
    kv_heads = keys.shape[1]
    group = heads // kv_heads
    blocks = triton.cdiv(keys.shape[2], key_block)  # the most a row can have: its keys lie in its slot
    # [rows, heads, blocks, 2 + dim]: each block's max score, sum of weights, weighted values
    part = torch.empty(rows, heads, blocks, 2 + dim, dtype=torch.float32, device=query.device)
    launch = dict(PDL=pdl, **launch_options(pdl))
    _row_attention_work_kernel[(programs,)](
        query, keys, values, part, slots, context, path, path_len, float(scale), rows, query.stride(0),
        query.stride(1), keys.stride(0), keys.stride(1), keys.stride(2), path.stride(0), part.stride(0),
        part.stride(1), part.stride(2), KV_HEADS=kv_heads, ROWS_PAD=triton.next_power_of_2(rows), GROUP=group,
        GROUP_PAD=max(16, triton.next_power_of_2(group)), DIM=dim, KEY_BLOCK=key_block,
        PRECISION="ieee" if query.dtype == torch.float32 else "tf32", num_warps=work_warps, **launch)
    # the combine at the work's warps: a reduction's order on the GPU follows its layout,
    # which follows the warps (part of every row's bits, the same for every row)
    _row_attention_combine_kernel[(rows, heads)](
        out, part, context, path_len, out.stride(0), out.stride(1), part.stride(0), part.stride(1), part.stride(2),
        DIM=dim, KEY_BLOCK=key_block, CHUNK=16, num_warps=work_warps, **launch)
