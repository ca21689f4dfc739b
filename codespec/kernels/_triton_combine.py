"""Row attention's combine (kernels/row_attention.py): a row's block partials (max score,
sum of weights, weighted values) into its output, in block order, CHUNK at a time, so a
row's keys alone fix the order; the `fold` schedule's combine of a row's query group at
once, and the zeros of rows with no keys. Apart from kernels/_triton_attention*.py, which
compute the partials (that module had grown past 500 lines)."""

from __future__ import annotations

import triton
import triton.language as tl

from codespec.kernels._triton_pdl import COUNTED, pdl_done
from codespec.kernels._triton_trace import ENDED, trace_mark, waited_program


@triton.jit
def _combine(out_ptr, part_ptr, row, head, blocks, s_out_row, s_out_head, s_part_row, s_part_head, s_part_block,
             DIM: tl.constexpr, CHUNK: tl.constexpr):
    # A row's query head: its block partials in block order, CHUNK at a time (a fixed tree
    # within a chunk, chunks in order): the row's keys fix the order.
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


@triton.jit
def _combine_group(out_ptr, part_ptr, row, kv_head, blocks, s_out_row, s_out_head, s_part_row, s_part_head,
                   s_part_block, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, DIM: tl.constexpr,
                   CHUNK: tl.constexpr):
    # The `fold` schedule's combine: a row's GROUP query heads of one KV head at once
    # ([GROUP_PAD, CHUNK] partials a step), block order fixed by the row's keys, as
    # _combine does one head at a time (another layout: other bits than the launched
    # combine's, the same for every row). Reads past L1: other programs wrote the partials.
    g = tl.arange(0, GROUP_PAD)
    c = tl.arange(0, CHUNK)
    d = tl.arange(0, DIM)
    real = g < GROUP
    head = kv_head * GROUP + g
    part = part_ptr + row * s_part_row + head[:, None] * s_part_head  # [GROUP_PAD, 1]
    best = tl.full([GROUP_PAD, CHUNK], float("-inf"), tl.float32)
    total_weight = tl.zeros([GROUP_PAD, CHUNK], tl.float32)
    acc = tl.zeros([GROUP_PAD, DIM], tl.float32)
    if blocks <= CHUNK:
        # one chunk (a fold's row of up to CHUNK blocks):
        # maxima, sums and values in one round trip, then the loops' arithmetic below for
        # their one step, in the same order (the same bits)
        inside = real[:, None] & (c < blocks)[None, :]
        at = part + c[None, :] * s_part_block
        maxima = tl.load(at, mask=inside, other=float("-inf"), cache_modifier=".cg")
        sums = tl.load(at + 1, mask=inside, other=0.0, cache_modifier=".cg")
        values = tl.load(at[:, :, None] + 2 + d[None, None, :], mask=inside[:, :, None], other=0.0,
                         cache_modifier=".cg")
        top = tl.where(real, tl.max(tl.maximum(best, maxima), axis=1), 0.0)
        rescale = tl.where(inside, tl.exp(maxima - top[:, None]), 0.0)
        total_weight += rescale * sums
        acc += tl.sum(rescale[:, :, None] * values, axis=1)
    else:
        for first in range(0, blocks, CHUNK):
            inside = real[:, None] & (first + c < blocks)[None, :]
            best = tl.maximum(best, tl.load(part + (first + c)[None, :] * s_part_block, mask=inside,
                                            other=float("-inf"), cache_modifier=".cg"))
        top = tl.where(real, tl.max(best, axis=1), 0.0)  # a maximum is the same in any order
        for first in range(0, blocks, CHUNK):
            inside = real[:, None] & (first + c < blocks)[None, :]
            at = part + (first + c)[None, :] * s_part_block
            rescale = tl.where(inside, tl.exp(tl.load(at, mask=inside, other=0.0, cache_modifier=".cg")
                                              - top[:, None]), 0.0)
            total_weight += rescale * tl.load(at + 1, mask=inside, other=0.0, cache_modifier=".cg")
            values = tl.load(at[:, :, None] + 2 + d[None, None, :], mask=inside[:, :, None], other=0.0,
                             cache_modifier=".cg")
            acc += tl.sum(rescale[:, :, None] * values, axis=1)
    weight = tl.sum(total_weight, axis=1)
    result = acc / tl.where(weight > 0, weight, 1.0)[:, None]
    tl.store(out_ptr + row * s_out_row + head[:, None] * s_out_head + d[None, :],
             result.to(out_ptr.dtype.element_ty), mask=real[:, None])


@triton.jit
def zero_keyless_rows(out_ptr, per_row, rows, s_out_row, s_out_head, HEADS: tl.constexpr, HEADS_PAD: tl.constexpr,
                      DIM: tl.constexpr, ROWS_PAD: tl.constexpr):
    # Zeros for the rows with no keys (padding: `per_row`, their blocks or chunks, is 0),
    # row i by program i mod programs: what the launches that combine in place write for
    # them (a reader of every row finds numbers, never what memory held).
    r = tl.arange(0, ROWS_PAD)
    h = tl.arange(0, HEADS_PAD)
    d = tl.arange(0, DIM)
    for row in range(tl.program_id(0), rows, tl.num_programs(0)):
        if tl.sum(tl.where(r == row, per_row, 0), axis=0) == 0:
            tl.store(out_ptr + row * s_out_row + h[:, None] * s_out_head + d[None, :],
                     tl.zeros([HEADS_PAD, DIM], tl.float32).to(out_ptr.dtype.element_ty), mask=(h < HEADS)[:, None])


@triton.jit(do_not_specialize=COUNTED)
def _row_attention_combine_kernel(out_ptr, part_ptr, context_ptr, path_len_ptr, s_out_row, s_out_head,
                                  s_part_row, s_part_head, s_part_block, trace_ptr, clock_ptr, flags_ptr, launch,
                                  before, DIM: tl.constexpr, KEY_BLOCK: tl.constexpr, CHUNK: tl.constexpr,
                                  PDL: tl.constexpr, CLOCK: tl.constexpr, FLAGS: tl.constexpr):
    # One program per (row, query head).
    program = waited_program(trace_ptr, clock_ptr, flags_ptr, launch, before, PDL, FLAGS, CLOCK)
    row = tl.program_id(0)
    blocks = tl.cdiv(tl.load(context_ptr + row) + tl.load(path_len_ptr + row), KEY_BLOCK)
    _combine(out_ptr, part_ptr, row, tl.program_id(1), blocks, s_out_row, s_out_head, s_part_row, s_part_head,
             s_part_block, DIM, CHUNK)
    trace_mark(trace_ptr, clock_ptr, program, ENDED, CLOCK)
    pdl_done(flags_ptr, launch, FLAGS)
