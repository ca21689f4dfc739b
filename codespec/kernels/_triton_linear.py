"""The Triton kernels behind `row_linear` (imported only when one runs: on CUDA tensors,
or on CPU under `TRITON_INTERPRET=1` in the tests): the product's program up to its K
loop's sums (the wait, the warming, the rows that hold a token, the screen's verdict, the
norm, the loop over a group of row blocks), its launcher, and the embedding's launch. What
follows the K loop is in kernels/_triton_linear_finish.py. The wrapper checked the
arguments."""

from __future__ import annotations

import os
from typing import Any

import torch
import triton
import triton.language as tl

from codespec.kernels._triton import live_rows
from codespec.kernels._triton_linear_finish import (_choices_kernel, _epilogue_inputs, _finish,
                                                    _row_linear_reduce_kernel, _split_sum)
from codespec.kernels._triton_pdl import COUNTED, launch_options, pdl_done, pdl_start, pdl_wait_for
from codespec.kernels._triton_trace import (COMPUTED, ENDED, REDUCED, START, WAITED, launch_hooks, program_index,
                                            trace_mark)
from codespec.kernels.flags import TakeFlag, flagged
from codespec.kernels.trace import TakeTrace

_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
SECTOR_BYTES = 32  # what one prefetch.global.L2 brings in
WARM_LANES = 512  # prefetches a program issues at a time (a few registers a thread)


@triton.jit
def sector_prefetch(at, inside):
    # prefetch.global.L2 at each lane's address where `inside`: its sector comes into L2,
    # nothing returns to a register (the zeros returned keep the call in the program).
    return tl.inline_asm_elementwise("@$2 prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l,b", [at, inside],
                                     dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _rows_load(at, live, LIVE: tl.constexpr):
    # [BLOCK_M, ...] values; a row without a token is not read (zeros)
    if LIVE:
        return tl.load(at, mask=live[:, None], other=0.0)
    return tl.load(at)


@triton.jit
def _operand(x_ptr, norm_ptr, m, k, s_x, scale, live, NORM: tl.constexpr, LIVE: tl.constexpr):
    """The product's left operand for rows m, columns k, in the model's dtype, rounded
    where transformers' eager code rounds: the norm's normalised x, then its weight times
    that."""
    dtype = x_ptr.dtype.element_ty
    x = _rows_load(x_ptr + m[:, None] * s_x + k[None, :], live, LIVE)
    if NORM:
        normed = (x.to(tl.float32) * scale[:, None]).to(dtype).to(tl.float32)
        return (normed * tl.load(norm_ptr + k).to(tl.float32)[None, :]).to(dtype)
    return x


@triton.jit
def _norm_scale(x_ptr, sq_in_ptr, m, k_size, eps, s_x, s_sq_in, live, LIVE: tl.constexpr, SQUARES_IN: tl.constexpr,
                SQUARES_PAD: tl.constexpr, BLOCK_K: tl.constexpr):
    """RMSNorm's 1 / rms for rows m, in float32. With SQUARES_IN, from the row's partial
    sums of squares that the product which wrote x left (`squares_out`): one load of a
    few floats. Without, by walking the row BLOCK_K at a time: a chain of dependent loads
    before the product's own loop starts (for callers that pass no sums)."""
    if SQUARES_IN > 0:
        b = tl.arange(0, SQUARES_PAD)
        partial = tl.load(sq_in_ptr + m[:, None] * s_sq_in + b[None, :], mask=live[:, None] & (b < SQUARES_IN)[None, :],
                          other=0.0)
        squares = tl.sum(partial, axis=1)
    else:
        squares = tl.zeros(m.shape, tl.float32)
        for begin in range(0, k_size, BLOCK_K):
            x = _rows_load(x_ptr + m[:, None] * s_x + begin + tl.arange(0, BLOCK_K)[None, :], live,
                           LIVE).to(tl.float32)
            squares += tl.sum(x * x, axis=1)
    return tl.rsqrt(squares / k_size + eps)


@triton.jit
def _warm_weights(w_ptr, n_first, k_first, k_last, s_w, BLOCK_N: tl.constexpr, SECTOR: tl.constexpr,
                  SECTORS: tl.constexpr, WARM_ROWS: tl.constexpr):
    # A prefetch into L2 for each SECTOR-element sector of weight rows n_first.. (BLOCK_N
    # of them), columns k_first..k_last: SECTORS a row (padded to a power of two),
    # WARM_ROWS rows at a time (all at once, the addresses would spill registers).
    column = k_first + tl.arange(0, SECTORS) * SECTOR
    inside = (column[None, :] < k_last) & (tl.arange(0, WARM_ROWS)[:, None] >= 0)
    for first in range(n_first, n_first + BLOCK_N, WARM_ROWS):
        row = first + tl.arange(0, WARM_ROWS)
        sector_prefetch(w_ptr + row[:, None] * s_w + column[None, :], inside)


@triton.jit(do_not_specialize=COUNTED)
def _row_linear_kernel(x_ptr, w_ptr, bias_ptr, norm_ptr, residual_ptr, out_ptr, part_ptr, context_ptr, path_len_ptr,
                       count_ptr, sq_in_ptr, block_out_ptr, index_out_ptr, cos_ptr, sin_ptr, positions_ptr, wslot_ptr,
                       wpos_ptr, k_ptr, v_ptr, trace_ptr, clock_ptr, flags_ptr, hi_ptr, best_ptr, launch, before,
                       k_size, eps, s_x, s_w, s_residual, s_out,
                       s_part_split, s_part, s_sq_in, s_block_out, s_rope, s_kv_slot, s_kv_head, s_kv_pos, s_hi,
                       STEPS_PER_SPLIT: tl.constexpr, SPLITS: tl.constexpr, HAS_BIAS: tl.constexpr,
                       NORM: tl.constexpr, SQUARES_IN: tl.constexpr, SQUARES_PAD: tl.constexpr,
                       SQUARES_OUT: tl.constexpr, CHOICES: tl.constexpr,
                       PAIRS: tl.constexpr, ROPE: tl.constexpr, HEADS: tl.constexpr, KV_HEADS: tl.constexpr,
                       DIM: tl.constexpr, RESIDUAL: tl.constexpr, LIVE: tl.constexpr, PDL: tl.constexpr,
                       PREFETCH: tl.constexpr, SECTOR: tl.constexpr, SECTORS: tl.constexpr, WARM_ROWS: tl.constexpr,
                       FOLD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       UPCAST: tl.constexpr, CLOCK: tl.constexpr, ROW_GROUP: tl.constexpr, FLAGS: tl.constexpr,
                       EARLY_ROWS: tl.constexpr, SCREENED: tl.constexpr):
    # One program per (BLOCK_N outputs, split of K, ROW_GROUP blocks of BLOCK_M rows): its
    # K range is fixed by the split's index alone, walked in BLOCK_K steps; an output row
    # depends on its own input row (a tensor-core product never mixes rows; the norm's sum
    # is per row). Each weight tile serves every block of the group that holds a token,
    # each block its own [BLOCK_M, BLOCK_K] x [BLOCK_K, BLOCK_N] dot, as a group of one
    # computes it. CLOCK: its time at each phase into trace_ptr (kernels/_triton_trace.py).
    # SCREENED (lm_head behind its int8 screen, kernels/lm_screen.py): a block of outputs
    # no row of the group may take its choice from is not computed (_screened_out).
    program = program_index()
    trace_mark(trace_ptr, clock_ptr, program, START, CLOCK)
    pdl_start(PDL)
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    split = tl.program_id(1)
    m = tl.program_id(2) * (ROW_GROUP * BLOCK_M) + tl.arange(0, BLOCK_M)  # the group's first block
    first = split * STEPS_PER_SPLIT * BLOCK_K
    last = tl.minimum(first + STEPS_PER_SPLIT * BLOCK_K, k_size)
    if PREFETCH and tl.program_id(2) == 0:
        # this program's weights into L2 while the kernel before runs (no pass writes them),
        # by the first group of rows (never padding) for the groups below it too
        _warm_weights(w_ptr, tl.program_id(0) * BLOCK_N, first, last, s_w, BLOCK_N, SECTOR, SECTORS, WARM_ROWS)
    if EARLY_ROWS:
        # which rows hold a token (the pass's metadata: the host's copy, before the graph)
        # before the wait, off the chain after it (CODESPEC_CUDA_EARLY_ROWS)
        live0, live1, live2, live3, used = _group_rows(context_ptr, path_len_ptr, m, LIVE, ROW_GROUP, BLOCK_M, ".cg")
    pdl_wait_for(flags_ptr, launch, before, PDL, FLAGS)
    trace_mark(trace_ptr, clock_ptr, program, WAITED, CLOCK)
    if not EARLY_ROWS:
        live0, live1, live2, live3, used = _group_rows(context_ptr, path_len_ptr, m, LIVE, ROW_GROUP, BLOCK_M, "")
    if SCREENED:
        used = _screened_out(hi_ptr, best_ptr, block_out_ptr, index_out_ptr, x_ptr, m, live0, live1, live2, live3,
                             used, tl.program_id(0), s_hi, s_block_out, ROW_GROUP, BLOCK_M, BLOCK_N)
    if used > 0:  # a group of padding rows computes nothing
        inputs = None
        if ROW_GROUP == 1:
            # what the epilogue reads that no kernel writes (the bias, rotary's tables at the
            # rows' positions, where K and V go), in flight during the K loop: off the chain
            # of the program that stores the outputs (an H200 trace: q/k/v's epilogue
            # 1.3 us, its two dependent reads of positions then tables)
            inputs = _epilogue_inputs(m, tl.program_id(0) * BLOCK_N, bias_ptr, context_ptr, path_len_ptr, cos_ptr,
                                      sin_ptr, positions_ptr, wslot_ptr, wpos_ptr, s_rope, s_kv_slot, s_kv_head,
                                      s_kv_pos, HAS_BIAS, ROPE, HEADS, KV_HEADS, DIM, BLOCK_M, BLOCK_N)
        # the blocks up to the last that holds a token (a pass's rows come first, padding
        # after them): a step's one row computes one block, as a group of one does
        if ROW_GROUP == 1:
            acc0, acc1, acc2, acc3 = _products(x_ptr, w_ptr, norm_ptr, sq_in_ptr, live0, live1, live2, live3, m, n,
                                               first, last, k_size, eps, s_x, s_w, s_sq_in, NORM, LIVE, SQUARES_IN,
                                               SQUARES_PAD, UPCAST, BLOCK_M, BLOCK_N, BLOCK_K, 1)
        else:
            if used == 1:
                acc0, acc1, acc2, acc3 = _products(x_ptr, w_ptr, norm_ptr, sq_in_ptr, live0, live1, live2, live3, m, n,
                                                   first, last, k_size, eps, s_x, s_w, s_sq_in, NORM, LIVE,
                                                   SQUARES_IN, SQUARES_PAD, UPCAST, BLOCK_M, BLOCK_N, BLOCK_K, 1)
            elif used == 2:
                acc0, acc1, acc2, acc3 = _products(x_ptr, w_ptr, norm_ptr, sq_in_ptr, live0, live1, live2, live3, m, n,
                                                   first, last, k_size, eps, s_x, s_w, s_sq_in, NORM, LIVE,
                                                   SQUARES_IN, SQUARES_PAD, UPCAST, BLOCK_M, BLOCK_N, BLOCK_K, 2)
            else:
                acc0, acc1, acc2, acc3 = _products(x_ptr, w_ptr, norm_ptr, sq_in_ptr, live0, live1, live2, live3, m, n,
                                                   first, last, k_size, eps, s_x, s_w, s_sq_in, NORM, LIVE,
                                                   SQUARES_IN, SQUARES_PAD, UPCAST, BLOCK_M, BLOCK_N, BLOCK_K,
                                                   ROW_GROUP)
        trace_mark(trace_ptr, clock_ptr, program, COMPUTED, CLOCK)
        n_first = tl.program_id(0) * BLOCK_N
        for r in tl.static_range(ROW_GROUP):
            if r < used:  # this block holds a token
                if r == 0:
                    acc = acc0
                elif r == 1:
                    acc = acc1
                elif r == 2:
                    acc = acc2
                else:
                    acc = acc3
                rows = m + r * BLOCK_M
                if SPLITS == 1:
                    _finish(acc, bias_ptr, residual_ptr, out_ptr, block_out_ptr, index_out_ptr, rows, n_first,
                            s_residual, s_out, s_block_out, context_ptr, path_len_ptr, cos_ptr, sin_ptr, positions_ptr,
                            wslot_ptr, wpos_ptr, k_ptr, v_ptr, s_rope, s_kv_slot, s_kv_head, s_kv_pos, HAS_BIAS,
                            RESIDUAL, PAIRS, SQUARES_OUT, CHOICES, ROPE, HEADS, KV_HEADS, DIM, BLOCK_M, BLOCK_N,
                            inputs, ROW_GROUP == 1)
                else:
                    tl.store(part_ptr + split * s_part_split + rows[:, None] * s_part + n[None, :], acc)
        if SPLITS > 1 and FOLD:  # the program that stores a group's last split adds them all, as the reduce kernel does
            tl.debug_barrier()  # every thread's partial stored before the count says so
            count = count_ptr + tl.program_id(0) * tl.num_programs(2) + tl.program_id(2)
            if tl.atomic_add(count, 1, sem="acq_rel", scope="gpu") == SPLITS - 1:
                for r in tl.static_range(ROW_GROUP):
                    if r < used:
                        rows = m + r * BLOCK_M
                        # the reduce kernel's sum
                        total = _split_sum(part_ptr, rows, n, s_part_split, s_part, SPLITS, ".cg")
                        trace_mark(trace_ptr, clock_ptr, program, REDUCED, CLOCK)
                        _finish(total, bias_ptr, residual_ptr, out_ptr, block_out_ptr, index_out_ptr, rows, n_first,
                                s_residual, s_out, s_block_out, context_ptr, path_len_ptr, cos_ptr, sin_ptr,
                                positions_ptr, wslot_ptr, wpos_ptr, k_ptr, v_ptr, s_rope, s_kv_slot, s_kv_head,
                                s_kv_pos, HAS_BIAS, RESIDUAL, PAIRS, SQUARES_OUT, CHOICES, ROPE, HEADS, KV_HEADS, DIM,
                                BLOCK_M, BLOCK_N, inputs, ROW_GROUP == 1)
                tl.atomic_xchg(count, 0, sem="relaxed", scope="gpu")  # zero for the next launch
    trace_mark(trace_ptr, clock_ptr, program, ENDED, CLOCK)
    pdl_done(flags_ptr, launch, FLAGS)


@triton.jit
def _group_rows(context_ptr, path_len_ptr, m, LIVE: tl.constexpr, ROW_GROUP: tl.constexpr, BLOCK_M: tl.constexpr,
                READ: tl.constexpr):
    # Which rows hold a token in each of the group's blocks (from rows m; past ROW_GROUP,
    # the first block's again), and how many blocks to compute: up to the last that holds
    # a token (0: none does). READ: the metadata's cache modifier (".cg" before the wait).
    live0 = live_rows(context_ptr, path_len_ptr, m, LIVE, READ)
    live1, live2, live3 = live0, live0, live0
    if ROW_GROUP > 1:
        live1 = live_rows(context_ptr, path_len_ptr, m + BLOCK_M, LIVE, READ)
    if ROW_GROUP > 2:
        live2 = live_rows(context_ptr, path_len_ptr, m + 2 * BLOCK_M, LIVE, READ)
        live3 = live_rows(context_ptr, path_len_ptr, m + 3 * BLOCK_M, LIVE, READ)
    used = tl.where(tl.max(live0.to(tl.int32), axis=0) > 0, 1, 0)
    if ROW_GROUP > 1:
        used = tl.where(tl.max(live1.to(tl.int32), axis=0) > 0, 2, used)
    if ROW_GROUP > 2:
        used = tl.where(tl.max(live2.to(tl.int32), axis=0) > 0, 3, used)
        used = tl.where(tl.max(live3.to(tl.int32), axis=0) > 0, 4, used)
    return live0, live1, live2, live3, used


@triton.jit
def _screened_out(hi_ptr, best_ptr, block_out_ptr, index_out_ptr, x_ptr, m, live0, live1, live2, live3, used, block,
                  s_hi, s_block_out, ROW_GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # The group's blocks to compute (`used`), or none where the screen rules this block of
    # outputs out for every row of the group that holds a token: its rounded upper bound
    # (hi) below each such row's rounded best lower bound, rounded as the stored logits
    # round. Then the block's maximum is -inf for each of the group's rows (its index its
    # first output, within bounds): the choices launch never picks it over a flagged block.
    dtype = x_ptr.dtype.element_ty
    keep = _flags_block(hi_ptr, best_ptr, m, live0, block, s_hi, dtype)
    if ROW_GROUP > 1:
        keep = keep | _flags_block(hi_ptr, best_ptr, m + BLOCK_M, live1, block, s_hi, dtype)
    if ROW_GROUP > 2:
        keep = keep | _flags_block(hi_ptr, best_ptr, m + 2 * BLOCK_M, live2, block, s_hi, dtype)
        keep = keep | _flags_block(hi_ptr, best_ptr, m + 3 * BLOCK_M, live3, block, s_hi, dtype)
    if tl.where(keep, 0, used) > 0:  # a group that holds a token, none of it flagging the block
        for r in tl.static_range(ROW_GROUP):
            at = (m + r * BLOCK_M) * s_block_out + block
            tl.store(block_out_ptr + at, tl.full([BLOCK_M], float("-inf"), tl.float32))
            tl.store(index_out_ptr + at, tl.full([BLOCK_M], 0, tl.int32) + block * BLOCK_N)
    return tl.where(keep, used, 0)


@triton.jit
def _flags_block(hi_ptr, best_ptr, rows, live, block, s_hi, dtype: tl.constexpr):
    # Whether any of `rows` that holds a token flags the block (kernels/lm_screen.flagged).
    hi = tl.load(hi_ptr + rows * s_hi + block, mask=live, other=float("-inf")).to(dtype).to(tl.float32)
    best = tl.load(best_ptr + rows, mask=live, other=float("inf")).to(dtype).to(tl.float32)
    return tl.max((live & ~(hi < best)).to(tl.int32), axis=0) > 0


@triton.jit
def _products(x_ptr, w_ptr, norm_ptr, sq_in_ptr, live0, live1, live2, live3, m, n, first, last, k_size, eps, s_x,
              s_w, s_sq_in, NORM: tl.constexpr, LIVE: tl.constexpr, SQUARES_IN: tl.constexpr,
              SQUARES_PAD: tl.constexpr, UPCAST: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_K: tl.constexpr, BLOCKS: tl.constexpr):
    # The float32 products of the first BLOCKS blocks of BLOCK_M rows from rows m (the rest
    # zeros; live0.. their rows that hold a token) over K's range first..last, each weight
    # tile loaded once for all of them.
    m1, m2, m3 = m + BLOCK_M, m + 2 * BLOCK_M, m + 3 * BLOCK_M
    scale0 = tl.zeros([BLOCK_M], tl.float32)
    scale1, scale2, scale3 = scale0, scale0, scale0
    if NORM:
        scale0 = _norm_scale(x_ptr, sq_in_ptr, m, k_size, eps, s_x, s_sq_in, live0, LIVE, SQUARES_IN, SQUARES_PAD,
                             BLOCK_K)
        if BLOCKS > 1:
            scale1 = _norm_scale(x_ptr, sq_in_ptr, m1, k_size, eps, s_x, s_sq_in, live1, LIVE, SQUARES_IN,
                                 SQUARES_PAD, BLOCK_K)
        if BLOCKS > 2:
            scale2 = _norm_scale(x_ptr, sq_in_ptr, m2, k_size, eps, s_x, s_sq_in, live2, LIVE, SQUARES_IN,
                                 SQUARES_PAD, BLOCK_K)
            scale3 = _norm_scale(x_ptr, sq_in_ptr, m3, k_size, eps, s_x, s_sq_in, live3, LIVE, SQUARES_IN,
                                 SQUARES_PAD, BLOCK_K)
    acc0 = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc1, acc2, acc3 = acc0, acc0, acc0
    for begin in range(first, last, BLOCK_K):
        k = begin + tl.arange(0, BLOCK_K)
        a = _operand(x_ptr, norm_ptr, m, k, s_x, scale0, live0, NORM, LIVE)
        w = tl.load(w_ptr + n[:, None] * s_w + k[None, :])
        acc0 += _dot(a, w, UPCAST)
        if BLOCKS > 1:
            acc1 += _dot(_operand(x_ptr, norm_ptr, m1, k, s_x, scale1, live1, NORM, LIVE), w, UPCAST)
        if BLOCKS > 2:
            acc2 += _dot(_operand(x_ptr, norm_ptr, m2, k, s_x, scale2, live2, NORM, LIVE), w, UPCAST)
            acc3 += _dot(_operand(x_ptr, norm_ptr, m3, k, s_x, scale3, live3, NORM, LIVE), w, UPCAST)
    return acc0, acc1, acc2, acc3


@triton.jit
def _dot(a, w, UPCAST: tl.constexpr):
    # A block's operand [BLOCK_M, BLOCK_K] times the weight tile w [BLOCK_N, BLOCK_K]
    if UPCAST:  # the interpreter's bf16 tl.dot returns garbage (triton 3.9): the tests' path
        return tl.dot(a.to(tl.float32), tl.trans(w.to(tl.float32)))
    return tl.dot(a, tl.trans(w))


def row_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, norm: torch.Tensor | None,
               eps: float, squares: torch.Tensor | None, pairs: bool, residual: torch.Tensor | None,
               squares_out: torch.Tensor | None, choices: torch.Tensor | None, rope: Any, out: torch.Tensor,
               block_m: int, block_n: int, block_k: int, splits: int, num_warps: int, num_stages: int,
               live: tuple[torch.Tensor, torch.Tensor] | None = None, pdl: bool = False, prefetch: bool = False,
               counts: torch.Tensor | None = None, trace: TakeTrace | None = None, row_group: int = 1,
               flags: TakeFlag | None = None, early_rows: bool = False,
               screened: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
    rows = x.shape[0]
    n_size, k_size = weight.shape
    steps = k_size // block_k
    per_split = triton.cdiv(steps, splits)
    splits = triton.cdiv(steps, per_split)  # no empty split
    part = torch.empty(splits, rows, n_size, dtype=torch.float32, device=x.device) if splits > 1 else out
    fusion = dict(HAS_BIAS=bias is not None, RESIDUAL=residual is not None, PAIRS=pairs,
                  SQUARES_OUT=squares_out is not None, CHOICES=choices is not None, ROPE=rope is not None,
                  HEADS=rope.heads if rope is not None else 1, KV_HEADS=rope.kv_heads if rope is not None else 1,
                  DIM=rope.keys.shape[3] if rope is not None else 2, LIVE=live is not None, PDL=pdl)
    pointers = (bias if bias is not None else out, residual if residual is not None else out)
    context, path_len = live if live is not None else (out, out)
    # one float per row and block of outputs (the sums of squares, or the maxima with their
    # indices for the choices)
    blocks = n_size // block_n
    if choices is not None:
        block_out = torch.empty(rows, blocks, dtype=torch.float32, device=x.device)
        index_out = torch.empty(rows, blocks, dtype=torch.int32, device=x.device)
    else:
        block_out, index_out = (squares_out if squares_out is not None else out), out
    sq_in, s_sq_in = (squares, squares.stride(0)) if squares is not None else (out, 0)
    if rope is not None:  # the tables, the rows' positions and KV places, the cache's layer
        rope_pointers = (rope.cos, rope.sin, rope.positions, rope.write_slots, rope.write_positions, rope.keys,
                         rope.values)
        rope_strides = (rope.cos.stride(0), rope.keys.stride(0), rope.keys.stride(1), rope.keys.stride(2))
    else:
        rope_pointers, rope_strides = (out,) * 7, (0,) * 4
    s_residual = residual.stride(0) if residual is not None else 0
    sector = SECTOR_BYTES // weight.element_size()
    sectors = triton.next_power_of_2(triton.cdiv(per_split * block_k, sector))
    fold = counts is not None and splits > 1
    # rotary rounds each product and the sum as transformers does: no fused multiply-adds
    launch = launch_options(pdl, fp_fusion=rope is None)
    grid = (blocks, splits, rows // (block_m * row_group))
    hooks, hooked = launch_hooks(trace, flags, "", grid[0] * grid[1] * grid[2], out)
    screen_pointers = screened if screened is not None else (block_out, block_out)  # hi, best
    _row_linear_kernel[grid](
        x, weight, pointers[0], norm if norm is not None else out, pointers[1], out, part, context, path_len,
        counts if fold else context, sq_in, block_out, index_out, *rope_pointers, *hooks[:3], *screen_pointers,
        *hooks[3:], k_size, float(eps), x.stride(0), weight.stride(0), s_residual, out.stride(0),
        part.stride(0) if splits > 1 else 0, part.stride(1) if splits > 1 else 0, s_sq_in, block_out.stride(0),
        *rope_strides, screen_pointers[0].stride(0) if screened is not None else 0, STEPS_PER_SPLIT=per_split,
        SPLITS=splits, NORM=norm is not None, SQUARES_IN=squares.shape[1] if squares is not None else 0,
        SQUARES_PAD=triton.next_power_of_2(squares.shape[1]) if squares is not None else 1,
        PREFETCH=prefetch, SECTOR=sector, SECTORS=sectors,
        WARM_ROWS=min(block_n, max(1, WARM_LANES // sectors)), FOLD=fold, BLOCK_M=block_m,
        BLOCK_N=block_n, BLOCK_K=block_k, UPCAST=_INTERPRETED and x.dtype != torch.float32,
        ROW_GROUP=row_group, EARLY_ROWS=early_rows, SCREENED=screened is not None, num_warps=num_warps,
        num_stages=num_stages, **hooked, **fusion, **launch)
    whole_blocks = squares_out is not None or choices is not None or rope is not None
    if splits > 1 and not fold:
        block = reduce_block(n_size, block_n, whole_blocks)
        flag = flags(n_size // block * rows) if flags is not None else None
        _row_linear_reduce_kernel[(n_size // block, rows)](
            part, *pointers, out, block_out, index_out, context, path_len, *rope_pointers, *flagged(flag, out),
            part.stride(0), part.stride(1), s_residual, out.stride(0), block_out.stride(0), *rope_strides,
            SPLITS=splits, BLOCK=block, FLAGS=flag is not None, **fusion, **launch)
    if choices is not None:
        flag = flags(rows) if flags is not None else None
        _choices_kernel[(rows,)](block_out, index_out, choices, *flagged(flag, out), block_out.stride(0), N=n_size,
                                 BLOCKS=blocks, BLOCKS_PAD=triton.next_power_of_2(blocks), PDL=pdl,
                                 FLAGS=flag is not None, num_warps=4, **launch_options(pdl))


@triton.jit(do_not_specialize=COUNTED)
def _embed_squares_kernel(ids_ptr, table_ptr, out_ptr, squares_ptr, flags_ptr, launch, before, s_table, s_out,
                          s_squares, width, BLOCK: tl.constexpr, BLOCKS_PAD: tl.constexpr, PDL: tl.constexpr,
                          FLAGS: tl.constexpr):
    # One program per row: its token's embedding copied, and its sum of squares per BLOCK
    # columns (the first norm's `squares`, as o and down leave them for the later norms).
    pdl_start(PDL)
    pdl_wait_for(flags_ptr, launch, before, PDL, FLAGS)
    row = tl.program_id(0)
    b = tl.arange(0, BLOCKS_PAD)
    column = b[:, None] * BLOCK + tl.arange(0, BLOCK)[None, :]  # [BLOCKS_PAD, BLOCK]
    inside = column < width
    x = tl.load(table_ptr + tl.load(ids_ptr + row) * s_table + column, mask=inside, other=0.0)
    tl.store(out_ptr + row * s_out + column, x, mask=inside)
    stored = x.to(tl.float32)
    tl.store(squares_ptr + row * s_squares + b, tl.sum(stored * stored, axis=1), mask=b * BLOCK < width)
    pdl_done(flags_ptr, launch, FLAGS)


def embed_squares(ids: torch.Tensor, table: torch.Tensor, out: torch.Tensor, squares: torch.Tensor,
                  pdl: bool = False, flags: TakeFlag | None = None) -> None:
    width, blocks = table.shape[1], squares.shape[1]
    flag = flags(ids.shape[0]) if flags is not None else None
    _embed_squares_kernel[(ids.shape[0],)](ids, table, out, squares, *flagged(flag, out), table.stride(0),
                                           out.stride(0), squares.stride(0), width, BLOCK=width // blocks,
                                           BLOCKS_PAD=triton.next_power_of_2(blocks), PDL=pdl, FLAGS=flag is not None,
                                           **launch_options(pdl))


def reduce_block(n_size: int, block_n: int, whole_blocks: bool) -> int:
    """Outputs a program of the reduce kernel finishes: 128 where they tile N; the
    product's own block_n where the finish works on whole blocks (a sum of squares or a
    maximum per block, rotary on whole heads)."""
    return 128 if n_size % 128 == 0 and not whole_blocks else block_n
