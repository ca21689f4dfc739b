"""The Triton kernels behind kernels/lm_screen.py (imported only when one runs: on CUDA
tensors, or on CPU under `TRITON_INTERPRET=1` in the tests). The wrappers checked the
arguments; the bound they keep is lm_screen.py's docstring."""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from codespec.kernels._triton import live_rows
from codespec.kernels._triton_linear import _group_rows, _warm_weights
from codespec.kernels._triton_linear_finish import _nan_largest
from codespec.kernels._triton_pdl import COUNTED, launch_options, pdl_done, pdl_start, pdl_wait_for
from codespec.kernels._triton_trace import (COMPUTED, ENDED, START, WAITED, launch_hooks, program_index, trace_mark,
                                            waited_program)
from codespec.kernels.flags import TakeFlag
from codespec.kernels.trace import TakeTrace

_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
# The screen's pipeline depth, named: the sm_90 build with it copies the int8 tiles in 16
# bytes at a time, asynchronously (test_sm90_compile.py); a build without it read 4.
STAGES = 3
SECTOR_BYTES = 32  # what one prefetch.global.L2 brings in (kernels/_triton_linear.py's warming)


@triton.jit(do_not_specialize=COUNTED)
def _head_rows_kernel(x_ptr, sq_in_ptr, norm_ptr, normed_ptr, norms_ptr, best_ptr, context_ptr, path_len_ptr,
                      trace_ptr, clock_ptr, flags_ptr, launch, before, eps, s_x, s_sq_in, s_normed,
                      K: tl.constexpr, K_PAD: tl.constexpr, SQUARES_IN: tl.constexpr, SQUARES_PAD: tl.constexpr,
                      SLACK: tl.constexpr, LIVE: tl.constexpr, PDL: tl.constexpr, CLOCK: tl.constexpr,
                      FLAGS: tl.constexpr):
    # One program per row: the final norm of a row that holds a token, as row_linear's
    # operand rounds it (RMSNorm's scale from the partial sums of squares the last product
    # left, the normalised row rounded, then times the weight, rounded), stored once for
    # the screen and the exact product to read the same bits; its norm, rounded up by
    # SLACK past float32's sum; and the row's best lower bound, -inf for the screen to raise.
    program = waited_program(trace_ptr, clock_ptr, flags_ptr, launch, before, PDL, FLAGS, CLOCK)
    row = tl.program_id(0)
    tl.store(best_ptr + row, float("-inf"))
    m = row + tl.zeros([1], tl.int32)
    if tl.max(live_rows(context_ptr, path_len_ptr, m, LIVE, "").to(tl.int32), axis=0) > 0:
        dtype = x_ptr.dtype.element_ty
        b = tl.arange(0, SQUARES_PAD)
        squares = tl.sum(tl.load(sq_in_ptr + row * s_sq_in + b, mask=b < SQUARES_IN, other=0.0), axis=0)
        scale = tl.rsqrt(squares / K + eps)
        k = tl.arange(0, K_PAD)
        inside = k < K
        x = tl.load(x_ptr + row * s_x + k, mask=inside, other=0.0).to(tl.float32)
        normed = (x * scale).to(dtype).to(tl.float32)
        normed = (normed * tl.load(norm_ptr + k, mask=inside, other=0.0).to(tl.float32)).to(dtype)
        tl.store(normed_ptr + row * s_normed + k, normed, mask=inside)
        stored = normed.to(tl.float32)
        tl.store(norms_ptr + row, tl.sqrt(tl.sum(stored * stored, axis=0)) * SLACK)
    trace_mark(trace_ptr, clock_ptr, program, ENDED, CLOCK)
    pdl_done(flags_ptr, launch, FLAGS)


@triton.jit(do_not_specialize=COUNTED)
def _screen_kernel(x_ptr, q_ptr, scale_ptr, bound_ptr, norms_ptr, hi_ptr, best_ptr, context_ptr, path_len_ptr,
                   trace_ptr, clock_ptr, flags_ptr, launch, before, s_x, s_q, s_hi, K: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, FLAG_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   ROW_GROUP: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr, LIVE: tl.constexpr,
                   PDL: tl.constexpr, PREFETCH: tl.constexpr, SECTOR: tl.constexpr, SECTORS: tl.constexpr,
                   WARM_ROWS: tl.constexpr, CLOCK: tl.constexpr, FLAGS: tl.constexpr):
    # One program per (vocab block, group of ROW_GROUP blocks of BLOCK_M rows): the rows'
    # int8 products over the vocab block, each int8 tile loaded once for the group's
    # blocks up to the last that holds a token (a step's one row computes one block, a
    # 32-row pass two); then for each block, each row's largest upper bound in each
    # FLAG_N tokens (the exact product's block of outputs) into hi, and its largest lower
    # bound raised into the row's best (a float atomic max: every block's). The screen's
    # sums may take any order (the bound covers any), so grouping rows changes no choice.
    program = program_index()
    trace_mark(trace_ptr, clock_ptr, program, START, CLOCK)
    pdl_start(PDL)
    block = tl.program_id(0)
    m = tl.program_id(1) * (ROW_GROUP * BLOCK_M) + tl.arange(0, BLOCK_M)  # the group's first block
    if PREFETCH and tl.program_id(1) == 0:  # the block's int8 weights into L2 (no pass writes them)
        _warm_weights(q_ptr, block * BLOCK_N, 0, K, s_q, BLOCK_N, SECTOR, SECTORS, WARM_ROWS)
    pdl_wait_for(flags_ptr, launch, before, PDL, FLAGS)
    trace_mark(trace_ptr, clock_ptr, program, WAITED, CLOCK)
    live0, live1, live2, live3, used = _group_rows(context_ptr, path_len_ptr, m, LIVE, ROW_GROUP, BLOCK_M, "")
    if used > 0:  # a group of padding rows screens nothing
        if used == 1:
            acc0, acc1, acc2, acc3 = _screen_products(x_ptr, q_ptr, m, live0, live1, live2, live3, block, s_x, s_q,
                                                      K, BLOCK_M, BLOCK_N, BLOCK_K, UPCAST, IEEE, 1)
        elif used == 2:
            acc0, acc1, acc2, acc3 = _screen_products(x_ptr, q_ptr, m, live0, live1, live2, live3, block, s_x, s_q,
                                                      K, BLOCK_M, BLOCK_N, BLOCK_K, UPCAST, IEEE, 2)
        else:
            acc0, acc1, acc2, acc3 = _screen_products(x_ptr, q_ptr, m, live0, live1, live2, live3, block, s_x, s_q,
                                                      K, BLOCK_M, BLOCK_N, BLOCK_K, UPCAST, IEEE, ROW_GROUP)
        trace_mark(trace_ptr, clock_ptr, program, COMPUTED, CLOCK)
        _screen_bounds(acc0, m, live0, block, scale_ptr, bound_ptr, norms_ptr, hi_ptr, best_ptr, s_hi, BLOCK_N,
                       FLAG_N)
        if used > 1:
            _screen_bounds(acc1, m + BLOCK_M, live1, block, scale_ptr, bound_ptr, norms_ptr, hi_ptr, best_ptr, s_hi,
                           BLOCK_N, FLAG_N)
        if used > 2:
            _screen_bounds(acc2, m + 2 * BLOCK_M, live2, block, scale_ptr, bound_ptr, norms_ptr, hi_ptr, best_ptr,
                           s_hi, BLOCK_N, FLAG_N)
        if used > 3:
            _screen_bounds(acc3, m + 3 * BLOCK_M, live3, block, scale_ptr, bound_ptr, norms_ptr, hi_ptr, best_ptr,
                           s_hi, BLOCK_N, FLAG_N)
    trace_mark(trace_ptr, clock_ptr, program, ENDED, CLOCK)
    pdl_done(flags_ptr, launch, FLAGS)


@triton.jit
def _screen_products(x_ptr, q_ptr, m, live0, live1, live2, live3, block, s_x, s_q, K: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, UPCAST: tl.constexpr,
                     IEEE: tl.constexpr, BLOCKS: tl.constexpr):
    # The int8 products of the first BLOCKS blocks of BLOCK_M rows from rows m (the rest
    # zeros) over vocab block `block`, each int8 tile loaded once for all of them.
    n = block * BLOCK_N + tl.arange(0, BLOCK_N)
    acc0 = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc1, acc2, acc3 = acc0, acc0, acc0
    for first in range(0, K, BLOCK_K):
        k = first + tl.arange(0, BLOCK_K)
        q = tl.load(q_ptr + n[:, None] * s_q + k[None, :])
        acc0 += _int8_dot(tl.load(x_ptr + m[:, None] * s_x + k[None, :], mask=live0[:, None], other=0.0), q, UPCAST,
                          IEEE)
        if BLOCKS > 1:
            acc1 += _int8_dot(tl.load(x_ptr + (m + BLOCK_M)[:, None] * s_x + k[None, :], mask=live1[:, None],
                                      other=0.0), q, UPCAST, IEEE)
        if BLOCKS > 2:
            acc2 += _int8_dot(tl.load(x_ptr + (m + 2 * BLOCK_M)[:, None] * s_x + k[None, :], mask=live2[:, None],
                                      other=0.0), q, UPCAST, IEEE)
            acc3 += _int8_dot(tl.load(x_ptr + (m + 3 * BLOCK_M)[:, None] * s_x + k[None, :], mask=live3[:, None],
                                      other=0.0), q, UPCAST, IEEE)
    return acc0, acc1, acc2, acc3


@triton.jit
def _int8_dot(x, q, UPCAST: tl.constexpr, IEEE: tl.constexpr):
    # x [BLOCK_M, BLOCK_K] times the int8 tile q [BLOCK_N, BLOCK_K], in float32. Not x's
    # dtype straight under the interpreter: it casts int8 to bf16 wrongly (NaNs), so its
    # path takes both to float32; float32 rows multiply in IEEE float32 (tf32 would round
    # x past the bound's slack).
    if UPCAST:
        return tl.dot(x.to(tl.float32), tl.trans(q.to(tl.float32)))
    elif IEEE:
        return tl.dot(x, tl.trans(q.to(tl.float32)), input_precision="ieee")
    else:  # |q| <= 127 is exact in bf16 and float16
        return tl.dot(x, tl.trans(q.to(x.dtype)))


@triton.jit
def _screen_bounds(acc, m, live, block, scale_ptr, bound_ptr, norms_ptr, hi_ptr, best_ptr, s_hi,
                   BLOCK_N: tl.constexpr, FLAG_N: tl.constexpr):
    # Rows m's bounds from their int8 products `acc` over vocab block `block`: the largest
    # upper bound in each FLAG_N tokens into hi, the largest lower bound into best.
    n = block * BLOCK_N + tl.arange(0, BLOCK_N)
    approx = acc * tl.load(scale_ptr + n)[None, :]
    margin = tl.load(bound_ptr + n)[None, :] * tl.load(norms_ptr + m, mask=live, other=0.0)[:, None]
    hi = _nan_largest(approx + margin)  # a NaN: its block flagged
    lo = approx - margin
    lo = tl.where(lo == lo, lo, float("-inf"))  # a NaN excludes nothing
    PARTS: tl.constexpr = BLOCK_N // FLAG_N
    part = block * PARTS + tl.arange(0, PARTS)
    tl.store(hi_ptr + m[:, None] * s_hi + part[None, :], tl.max(tl.reshape(hi, [m.shape[0], PARTS, FLAG_N]), axis=2),
             mask=live[:, None])
    tl.atomic_max(best_ptr + m, tl.max(lo, axis=1), mask=live, sem="relaxed", scope="gpu")


def head_rows(x: torch.Tensor, squares: torch.Tensor, norm: torch.Tensor, eps: float, normed: torch.Tensor,
              norms: torch.Tensor, best: torch.Tensor, live: tuple[torch.Tensor, torch.Tensor] | None, pdl: bool,
              trace: TakeTrace | None, flags: TakeFlag | None, slack: float) -> None:
    rows, width = x.shape
    context, path_len = live if live is not None else (best, best)
    hooks, hooked = launch_hooks(trace, flags, "", rows, best)
    _head_rows_kernel[(rows,)](x, squares, norm, normed, norms, best, context, path_len, *hooks, float(eps),
                               x.stride(0), squares.stride(0), normed.stride(0), K=width,
                               K_PAD=triton.next_power_of_2(width), SQUARES_IN=squares.shape[1],
                               SQUARES_PAD=triton.next_power_of_2(squares.shape[1]), SLACK=slack,
                               LIVE=live is not None, PDL=pdl, num_warps=4, **hooked, **launch_options(pdl))


def screen(normed: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bound: torch.Tensor, norms: torch.Tensor,
           hi: torch.Tensor, best: torch.Tensor, block_m: int, block_n: int, flag_n: int, block_k: int,
           row_group: int, live: tuple[torch.Tensor, torch.Tensor] | None, pdl: bool, prefetch: bool,
           trace: TakeTrace | None, flags: TakeFlag | None) -> None:
    rows, width = normed.shape
    grid = (q.shape[0] // block_n, rows // (block_m * row_group))
    context, path_len = live if live is not None else (best, best)
    sector = SECTOR_BYTES // q.element_size()
    sectors = triton.next_power_of_2(triton.cdiv(width, sector))
    hooks, hooked = launch_hooks(trace, flags, "", grid[0] * grid[1], best)
    _screen_kernel[grid](normed, q, scale, bound, norms, hi, best, context, path_len, *hooks, normed.stride(0),
                         q.stride(0), hi.stride(0), K=width, BLOCK_M=block_m, BLOCK_N=block_n, FLAG_N=flag_n,
                         BLOCK_K=block_k, ROW_GROUP=row_group,
                         UPCAST=_INTERPRETED and normed.dtype != torch.float32,
                         IEEE=normed.dtype == torch.float32, LIVE=live is not None, PDL=pdl,
                         PREFETCH=prefetch, SECTOR=sector, SECTORS=sectors,
                         WARM_ROWS=min(block_n, max(1, 512 // sectors)), num_warps=screen_warps(row_group),
                         num_stages=STAGES, **hooked, **launch_options(pdl))


def screen_warps(row_group: int) -> int:
    """The screen's warps: 4, or 8 for four blocks of rows, whose four accumulators
    spill at 4 (sm_90 under Triton 3.6: 255 registers a thread and 48 bytes of stack;
    178 at 8, none; two blocks take 168 at 4)."""
    return 8 if row_group > 2 else 4
