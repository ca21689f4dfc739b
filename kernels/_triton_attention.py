"""The Triton kernels behind `row_attention` (kernels/row_attention.py; imported only when
one runs: on CUDA tensors, or on CPU under `TRITON_INTERPRET=1` in the tests).

The launcher takes arguments its wrapper already checked."""

from __future__ import annotations

import math
from typing import Any

import torch
import triton
import triton.language as tl

from codespec.kernels._triton_combine import _combine_group, _row_attention_combine_kernel, zero_keyless_rows
from codespec.kernels._triton_pdl import COUNTED, launch_options, pdl_done, pdl_start, pdl_wait_for
from codespec.kernels._triton_trace import ENDED, START, WAITED, launch_hooks, trace_mark, waited_program
from codespec.kernels.flags import TakeFlag
from codespec.kernels.trace import TakeTrace


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
    # One key block's softmax partial for a row's query group (max score, sum of weights,
    # weighted sum of values), written apart: a block is KEY_BLOCK *logical* keys, so what
    # it holds and how it is summed depend on the row's keys alone. Every launch schedule
    # below runs exactly this arithmetic for every block (_store_partial).
    offsets, inside = _block_offsets(path_ptr, row, kv_head, slot, context, total, block, s_kv_slot, s_kv_head,
                                     s_kv_pos, s_path, DIM, KEY_BLOCK, "")
    k = tl.load(k_ptr + offsets, mask=inside[:, None], other=0.0).to(tl.float32)
    v = tl.load(v_ptr + offsets, mask=inside[:, None], other=0.0).to(tl.float32)
    _store_partial(q, k, v, inside, part_ptr, row, kv_head, block, scale, s_part_row, s_part_head, s_part_block,
                   GROUP, GROUP_PAD, DIM, PRECISION)


@triton.jit
def _block_offsets(path_ptr, row, kv_head, slot, context, total, block, s_kv_slot, s_kv_head, s_kv_pos, s_path,
                   DIM: tl.constexpr, KEY_BLOCK: tl.constexpr, READ: tl.constexpr):
    # Where a block's KEY_BLOCK logical keys sit in the cache ([KEY_BLOCK, DIM] offsets:
    # the context's positions, then the path's), and which of them the row has. READ: the
    # path's cache modifier (".cg" where it is read before the wait, _early_keys).
    d = tl.arange(0, DIM)
    base = slot * s_kv_slot + kv_head * s_kv_head
    t = block * KEY_BLOCK + tl.arange(0, KEY_BLOCK)
    inside = t < total
    on_path = t >= context
    step = tl.load(path_ptr + row * s_path + (t - context), mask=inside & on_path, other=0, cache_modifier=READ)
    position = tl.where(on_path, step, t)
    return base + position[:, None] * s_kv_pos + d[None, :], inside


@triton.jit
def _store_partial(q, k, v, inside, part_ptr, row, kv_head, block, scale, s_part_row, s_part_head, s_part_block,
                   GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, DIM: tl.constexpr, PRECISION: tl.constexpr):
    # The block's partial from its keys k and values v ([KEY_BLOCK, DIM] in float32, zeros
    # where not `inside`), into part.
    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, DIM)
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


@triton.jit(do_not_specialize=COUNTED)
def _row_attention_block_kernel(q_ptr, k_ptr, v_ptr, part_ptr, slots_ptr, context_ptr, path_ptr, path_len_ptr,
                                scale, s_q_row, s_q_head, s_kv_slot, s_kv_head, s_kv_pos, s_path,
                                s_part_row, s_part_head, s_part_block, trace_ptr, clock_ptr, flags_ptr, launch,
                                before, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, DIM: tl.constexpr,
                                KEY_BLOCK: tl.constexpr, PRECISION: tl.constexpr, PDL: tl.constexpr,
                                CLOCK: tl.constexpr, FLAGS: tl.constexpr):
    # The `grid` schedule: one program per (row, KV head, program of the block axis),
    # taking the row's key blocks b = program, program + programs, ...
    program = waited_program(trace_ptr, clock_ptr, flags_ptr, launch, before, PDL, FLAGS, CLOCK)
    row = tl.program_id(0)
    kv_head = tl.program_id(1)
    slot, context, total = _row_keys(slots_ptr, context_ptr, path_len_ptr, row)
    q = _query_group(q_ptr, row, kv_head, s_q_row, s_q_head, GROUP, GROUP_PAD, DIM)
    for block in range(tl.program_id(2), tl.cdiv(total, KEY_BLOCK), tl.num_programs(2)):
        _block_partial(q, k_ptr, v_ptr, part_ptr, path_ptr, row, kv_head, slot, context, total, block, scale,
                       s_kv_slot, s_kv_head, s_kv_pos, s_path, s_part_row, s_part_head, s_part_block,
                       GROUP, GROUP_PAD, DIM, KEY_BLOCK, PRECISION)
    trace_mark(trace_ptr, clock_ptr, program, ENDED, CLOCK)
    pdl_done(flags_ptr, launch, FLAGS)


@triton.jit
def _row_keys(slots_ptr, context_ptr, path_len_ptr, row):
    # A row's slot, its contiguous keys and all its keys (the pass's metadata).
    slot = tl.load(slots_ptr + row)
    context = tl.load(context_ptr + row)
    return slot, context, context + tl.load(path_len_ptr + row)


@triton.jit
def _early_row_keys(slots_ptr, context_ptr, path_len_ptr, row, has):
    # _row_keys before the wait (past L1), of a row only where `has` (zeros otherwise: an
    # item past the pass's has no row)
    slot = tl.load(slots_ptr + row, mask=has, other=0, cache_modifier=".cg")
    context = tl.load(context_ptr + row, mask=has, other=0, cache_modifier=".cg")
    return slot, context, context + tl.load(path_len_ptr + row, mask=has, other=0, cache_modifier=".cg")


@triton.jit
def _pass_blocks(context_ptr, path_len_ptr, rows, ROWS_PAD: tl.constexpr, KEY_BLOCK: tl.constexpr,
                 READ: tl.constexpr):
    # Each row's key blocks ([ROWS_PAD], 0 past the pass's rows and for padding rows), and
    # where each row's blocks end in the pass's flat list of blocks. READ: the loads' cache
    # modifier (".cg" before the wait, _early_keys).
    r = tl.arange(0, ROWS_PAD)
    listed = r < rows
    keys = (tl.load(context_ptr + r, mask=listed, other=0, cache_modifier=READ)
            + tl.load(path_len_ptr + r, mask=listed, other=0, cache_modifier=READ))
    blocks = tl.cdiv(keys, KEY_BLOCK)
    return blocks, tl.cumsum(blocks, axis=0)


@triton.jit
def _wave_start(context_ptr, path_len_ptr, rows, trace_ptr, clock_ptr, flags_ptr, launch, before,
                ROWS_PAD: tl.constexpr, KEY_BLOCK: tl.constexpr, PDL: tl.constexpr, CLOCK: tl.constexpr,
                FLAGS: tl.constexpr):
    # A worklist wave's program up to its work: _wave_wait, then the pass's blocks.
    _wave_wait(trace_ptr, clock_ptr, flags_ptr, launch, before, PDL, CLOCK, FLAGS)
    return _pass_blocks(context_ptr, path_len_ptr, rows, ROWS_PAD, KEY_BLOCK, "")


@triton.jit
def _wave_wait(trace_ptr, clock_ptr, flags_ptr, launch, before, PDL: tl.constexpr, CLOCK: tl.constexpr,
               FLAGS: tl.constexpr):
    # A wave's program's start marked, its dependents let go, the wait for the kernel
    # before. (Not waited_program: its row from all three grid axes took traced builds 4
    # registers more, for a one-axis grid.)
    trace_mark(trace_ptr, clock_ptr, tl.program_id(0), START, CLOCK)
    pdl_start(PDL)
    pdl_wait_for(flags_ptr, launch, before, PDL, FLAGS)
    trace_mark(trace_ptr, clock_ptr, tl.program_id(0), WAITED, CLOCK)


@triton.jit
def _item_place(item, blocks, ends, KV_HEADS: tl.constexpr, ROWS_PAD: tl.constexpr):
    # Item `item` of the pass's (row, key block, KV head) list, in that order: its row, KV
    # head and block.
    kv_head = item % KV_HEADS
    flat = item // KV_HEADS
    row = tl.sum((ends <= flat).to(tl.int32), axis=0)  # the rows whose blocks all come before
    block = flat - tl.sum(tl.where(tl.arange(0, ROWS_PAD) < row, blocks, 0), axis=0)
    return row, kv_head, block


@triton.jit
def _early_keys(item, items, blocks, ends, k_ptr, v_ptr, slots_ptr, context_ptr, path_ptr, path_len_ptr, rows,
                s_kv_slot, s_kv_head, s_kv_pos, s_path, KV_HEADS: tl.constexpr, ROWS_PAD: tl.constexpr,
                DIM: tl.constexpr, KEY_BLOCK: tl.constexpr):
    # Before the wait (EARLY): what item `item` (none at or past `items`) reads that no
    # kernel of this replay writes. The pass's metadata and path (the host's copy, before
    # the graph), and the keys and values of the row's context below `context - rows`:
    # a replay of `rows` rows writes K and V only at its rows' write positions, and a row
    # on its tree's main chain sees the chain's positions up to its own in its context, so
    # every position this replay writes in the row's slot is at least context - rows
    # (forward/passlayout.py; tests pin it). Read past L1, which a programmatic dependent
    # is not promised to find current before its wait. The rest, after the wait (_late_partial).
    row, kv_head, block = _item_place(item, blocks, ends, KV_HEADS, ROWS_PAD)
    slot, context, total = _early_row_keys(slots_ptr, context_ptr, path_len_ptr, row, item < items)
    offsets, inside = _block_offsets(path_ptr, row, kv_head, slot, context, total, block, s_kv_slot, s_kv_head,
                                     s_kv_pos, s_path, DIM, KEY_BLOCK, ".cg")
    early = inside & (block * KEY_BLOCK + tl.arange(0, KEY_BLOCK) < context - rows)
    k = tl.load(k_ptr + offsets, mask=early[:, None], other=0.0, cache_modifier=".cg")
    v = tl.load(v_ptr + offsets, mask=early[:, None], other=0.0, cache_modifier=".cg")
    return row, kv_head, block, offsets, inside, early, k, v


@triton.jit
def _late_partial(q_ptr, k_ptr, v_ptr, part_ptr, row, kv_head, block, offsets, inside, early, k_early, v_early, scale,
                  s_q_row, s_q_head, s_part_row, s_part_head, s_part_block, GROUP: tl.constexpr,
                  GROUP_PAD: tl.constexpr, DIM: tl.constexpr, PRECISION: tl.constexpr):
    # After the wait: the rest of an item _early_keys began (the query, the keys and values
    # this replay may have written), and its partial. The same keys and values as
    # _block_partial loads, the same arithmetic: the same bits.
    q = _query_group(q_ptr, row, kv_head, s_q_row, s_q_head, GROUP, GROUP_PAD, DIM)
    late = inside & (early == 0)
    k = tl.where(early[:, None], k_early, tl.load(k_ptr + offsets, mask=late[:, None], other=0.0)).to(tl.float32)
    v = tl.where(early[:, None], v_early, tl.load(v_ptr + offsets, mask=late[:, None], other=0.0)).to(tl.float32)
    _store_partial(q, k, v, inside, part_ptr, row, kv_head, block, scale, s_part_row, s_part_head, s_part_block,
                   GROUP, GROUP_PAD, DIM, PRECISION)


@triton.jit
def _work_item(item, blocks, ends, q_ptr, k_ptr, v_ptr, part_ptr, slots_ptr, context_ptr, path_ptr, path_len_ptr,
               scale, s_q_row, s_q_head, s_kv_slot, s_kv_head, s_kv_pos, s_path, s_part_row, s_part_head,
               s_part_block, KV_HEADS: tl.constexpr, ROWS_PAD: tl.constexpr, GROUP: tl.constexpr,
               GROUP_PAD: tl.constexpr, DIM: tl.constexpr, KEY_BLOCK: tl.constexpr, PRECISION: tl.constexpr):
    # Item `item` of the pass's (row, key block, KV head) list: its block's partial.
    row, kv_head, block = _item_place(item, blocks, ends, KV_HEADS, ROWS_PAD)
    slot, context, total = _row_keys(slots_ptr, context_ptr, path_len_ptr, row)
    q = _query_group(q_ptr, row, kv_head, s_q_row, s_q_head, GROUP, GROUP_PAD, DIM)
    _block_partial(q, k_ptr, v_ptr, part_ptr, path_ptr, row, kv_head, slot, context, total, block, scale,
                   s_kv_slot, s_kv_head, s_kv_pos, s_path, s_part_row, s_part_head, s_part_block,
                   GROUP, GROUP_PAD, DIM, KEY_BLOCK, PRECISION)
    return row, kv_head


@triton.jit
def _shared_blocks(slots_ptr, context_ptr, path_len_ptr, rows, ROWS_PAD: tl.constexpr, KEY_BLOCK: tl.constexpr,
                   ROWS: tl.constexpr):
    # The pass's items of several rows (ROWS): its rows in groups of ROWS consecutive ones,
    # and each group's shared blocks, the leading key blocks that lie wholly in the context
    # of every row of it that has keys, where all of them are of one slot (so the same
    # positions for each: 0 for a group of two slots). Returns each row's key blocks, each
    # group's shared blocks and where they end in the flat list of shared blocks, and each
    # row's other blocks (its own, after its group's shared ones) and where they end.
    r = tl.arange(0, ROWS_PAD)
    listed = r < rows
    context = tl.load(context_ptr + r, mask=listed, other=0)
    blocks = tl.cdiv(context + tl.load(path_len_ptr + r, mask=listed, other=0), KEY_BLOCK)
    slot = tl.load(slots_ptr + r, mask=listed, other=0)
    has = blocks > 0
    GROUPS: tl.constexpr = ROWS_PAD // ROWS
    never = 1 << 30
    whole = tl.min(tl.reshape(tl.where(has, context // KEY_BLOCK, never), [GROUPS, ROWS]), axis=1)
    first = tl.min(tl.reshape(tl.where(has, slot, never), [GROUPS, ROWS]), axis=1)
    last = tl.max(tl.reshape(tl.where(has, slot, -1), [GROUPS, ROWS]), axis=1)
    shared = tl.where((whole < never) & (first == last), whole, 0)
    shared_of_row = tl.reshape(tl.broadcast_to(shared[:, None], [GROUPS, ROWS]), [ROWS_PAD])
    own = tl.maximum(blocks - shared_of_row, 0)
    return blocks, shared, tl.cumsum(shared, axis=0), own, tl.cumsum(own, axis=0), shared_of_row, slot


@triton.jit
def _rows_work(item, blocks, shared, shared_ends, own, own_ends, shared_of_row, slot, q_ptr, k_ptr, v_ptr, part_ptr,
               out_ptr, count_ptr, slots_ptr, context_ptr, path_ptr, path_len_ptr, scale, s_q_row, s_q_head, s_kv_slot,
               s_kv_head, s_kv_pos, s_path, s_part_row, s_part_head, s_part_block, s_out_row, s_out_head,
               KV_HEADS: tl.constexpr, ROWS_PAD: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
               DIM: tl.constexpr, KEY_BLOCK: tl.constexpr, PRECISION: tl.constexpr, CHUNK: tl.constexpr,
               ROWS: tl.constexpr, FOLD: tl.constexpr):
    # Item `item` of the pass's items of several rows (_shared_blocks): first every
    # group's shared blocks (a block's keys and values loaded once, then each row's
    # partial from them in turn), then each row's own blocks (one row an item, as
    # _work_item). A shared block holds the same positions for every row of the group, so
    # the same values go into the same arithmetic (_store_partial) as a row alone loads:
    # the same bits. With FOLD, each row's partial then counted and combined where it was
    # its row's last (_fold_item), after the item's every partial.
    r = tl.arange(0, ROWS_PAD)
    shared_items = tl.sum(shared, axis=0) * KV_HEADS
    if item < shared_items:
        group, kv_head, block = _item_place(item, shared, shared_ends, KV_HEADS, ROWS_PAD // ROWS)
        in_group = (r >= group * ROWS) & (r < group * ROWS + ROWS) & (blocks > 0)
        group_slot = tl.max(tl.where(in_group, slot, 0), axis=0)
        t = block * KEY_BLOCK + tl.arange(0, KEY_BLOCK)
        offsets = (group_slot * s_kv_slot + kv_head * s_kv_head + t[:, None] * s_kv_pos
                   + tl.arange(0, DIM)[None, :])
        inside = t >= 0  # every key: the block lies wholly in each row's context
        k = tl.load(k_ptr + offsets, mask=inside[:, None], other=0.0).to(tl.float32)
        v = tl.load(v_ptr + offsets, mask=inside[:, None], other=0.0).to(tl.float32)
        for at in tl.range(0, ROWS, loop_unroll_factor=1):  # unrolled, two rows' loads overlap: more registers
            row = group * ROWS + at
            if tl.sum(tl.where(r == row, blocks, 0), axis=0) > 0:  # every row with keys has the block
                q = _query_group(q_ptr, row, kv_head, s_q_row, s_q_head, GROUP, GROUP_PAD, DIM)
                _store_partial(q, k, v, inside, part_ptr, row, kv_head, block, scale, s_part_row, s_part_head,
                               s_part_block, GROUP, GROUP_PAD, DIM, PRECISION)
        first, count = group * ROWS, ROWS
    else:
        first, kv_head, index = _item_place(item - shared_items, own, own_ends, KV_HEADS, ROWS_PAD)
        block = tl.sum(tl.where(r == first, shared_of_row, 0), axis=0) + index
        row_slot, context, total = _row_keys(slots_ptr, context_ptr, path_len_ptr, first)
        q = _query_group(q_ptr, first, kv_head, s_q_row, s_q_head, GROUP, GROUP_PAD, DIM)
        _block_partial(q, k_ptr, v_ptr, part_ptr, path_ptr, first, kv_head, row_slot, context, total, block, scale,
                       s_kv_slot, s_kv_head, s_kv_pos, s_path, s_part_row, s_part_head, s_part_block, GROUP,
                       GROUP_PAD, DIM, KEY_BLOCK, PRECISION)
        count = 1
    if FOLD:  # one place for the count and the combine, after the item's every partial (fewer registers)
        for at in tl.range(0, ROWS, loop_unroll_factor=1):
            row = first + at
            if (at < count) & (tl.sum(tl.where(r == row, blocks, 0), axis=0) > 0):
                _fold_item(out_ptr, part_ptr, count_ptr, row, kv_head, blocks, r, s_out_row, s_out_head, s_part_row,
                           s_part_head, s_part_block, KV_HEADS, GROUP, GROUP_PAD, DIM, CHUNK)


@triton.jit
def _rows_pass(q_ptr, k_ptr, v_ptr, part_ptr, out_ptr, count_ptr, slots_ptr, context_ptr, path_ptr, path_len_ptr,
               scale, rows, s_q_row, s_q_head, s_kv_slot, s_kv_head, s_kv_pos, s_path, s_part_row, s_part_head,
               s_part_block, s_out_row, s_out_head, trace_ptr, clock_ptr, flags_ptr, launch, before,
               KV_HEADS: tl.constexpr, ROWS_PAD: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
               HEADS_PAD: tl.constexpr, DIM: tl.constexpr, KEY_BLOCK: tl.constexpr, PRECISION: tl.constexpr,
               CHUNK: tl.constexpr, PDL: tl.constexpr, CLOCK: tl.constexpr, FLAGS: tl.constexpr, ROWS: tl.constexpr,
               FOLD: tl.constexpr):
    # A wave's program over the pass's items of several rows (_shared_blocks, _rows_work):
    # the worklist's partials, or with FOLD the fold's (rows with no keys zeroed first).
    # (_wave_wait, not _wave_start: _shared_blocks reads the pass's blocks with the slots.)
    _wave_wait(trace_ptr, clock_ptr, flags_ptr, launch, before, PDL, CLOCK, FLAGS)
    blocks, shared, shared_ends, own, own_ends, shared_of_row, slot = _shared_blocks(
        slots_ptr, context_ptr, path_len_ptr, rows, ROWS_PAD, KEY_BLOCK, ROWS)
    if FOLD:
        zero_keyless_rows(out_ptr, blocks, rows, s_out_row, s_out_head, GROUP * KV_HEADS, HEADS_PAD, DIM, ROWS_PAD)
    items = (tl.sum(shared, axis=0) + tl.sum(own, axis=0)) * KV_HEADS
    for item in range(tl.program_id(0), items, tl.num_programs(0)):
        _rows_work(item, blocks, shared, shared_ends, own, own_ends, shared_of_row, slot, q_ptr, k_ptr, v_ptr,
                   part_ptr, out_ptr, count_ptr, slots_ptr, context_ptr, path_ptr, path_len_ptr, scale, s_q_row,
                   s_q_head, s_kv_slot, s_kv_head, s_kv_pos, s_path, s_part_row, s_part_head, s_part_block, s_out_row,
                   s_out_head, KV_HEADS, ROWS_PAD, GROUP, GROUP_PAD, DIM, KEY_BLOCK, PRECISION, CHUNK, ROWS, FOLD)


@triton.jit(do_not_specialize=COUNTED)
def _row_attention_work_kernel(q_ptr, k_ptr, v_ptr, part_ptr, slots_ptr, context_ptr, path_ptr, path_len_ptr,
                               scale, rows, s_q_row, s_q_head, s_kv_slot, s_kv_head, s_kv_pos, s_path,
                               s_part_row, s_part_head, s_part_block, trace_ptr, clock_ptr, flags_ptr, launch, before,
                               KV_HEADS: tl.constexpr, ROWS_PAD: tl.constexpr, GROUP: tl.constexpr,
                               GROUP_PAD: tl.constexpr, DIM: tl.constexpr, KEY_BLOCK: tl.constexpr,
                               PRECISION: tl.constexpr, PDL: tl.constexpr, CLOCK: tl.constexpr, FLAGS: tl.constexpr,
                               EARLY: tl.constexpr, ROWS: tl.constexpr):
    # The `worklist` schedule: a fixed number of programs (a wave of the device) share the
    # pass's real work, the (row, key block, KV head) items in that order, item i going to
    # program i mod programs. Padding rows have no blocks, so they add no programs: a
    # one-row step over 512 keys is 8 items, not the grid's rows * KV heads * 16 programs.
    # EARLY: a program's first item begun before the wait (_early_keys). ROWS > 1: groups
    # of that many consecutive rows read their shared key blocks once (_rows_work).
    if ROWS > 1:
        _rows_pass(q_ptr, k_ptr, v_ptr, part_ptr, part_ptr, part_ptr, slots_ptr, context_ptr, path_ptr, path_len_ptr,
                   scale, rows, s_q_row, s_q_head, s_kv_slot, s_kv_head, s_kv_pos, s_path, s_part_row, s_part_head,
                   s_part_block, 0, 0, trace_ptr, clock_ptr, flags_ptr, launch, before, KV_HEADS, ROWS_PAD, GROUP,
                   GROUP_PAD, 16, DIM, KEY_BLOCK, PRECISION, 1, PDL, CLOCK, FLAGS, ROWS, False)
    elif EARLY:
        blocks, ends, _, _, _ = _early_first_item(
            q_ptr, k_ptr, v_ptr, part_ptr, slots_ptr, context_ptr, path_ptr, path_len_ptr, scale, rows, s_q_row,
            s_q_head, s_kv_slot, s_kv_head, s_kv_pos, s_path, s_part_row, s_part_head, s_part_block, trace_ptr,
            clock_ptr, flags_ptr, launch, before, KV_HEADS, ROWS_PAD, GROUP, GROUP_PAD, DIM, KEY_BLOCK, PRECISION, PDL,
            CLOCK, FLAGS)
        first = tl.program_id(0) + tl.num_programs(0)
    else:
        blocks, ends = _wave_start(context_ptr, path_len_ptr, rows, trace_ptr, clock_ptr, flags_ptr, launch, before,
                                   ROWS_PAD, KEY_BLOCK, PDL, CLOCK, FLAGS)
        first = tl.program_id(0)
    if ROWS == 1:
        for item in range(first, tl.sum(blocks, axis=0) * KV_HEADS, tl.num_programs(0)):
            _work_item(item, blocks, ends, q_ptr, k_ptr, v_ptr, part_ptr, slots_ptr, context_ptr, path_ptr,
                       path_len_ptr, scale, s_q_row, s_q_head, s_kv_slot, s_kv_head, s_kv_pos, s_path, s_part_row,
                       s_part_head, s_part_block, KV_HEADS, ROWS_PAD, GROUP, GROUP_PAD, DIM, KEY_BLOCK, PRECISION)
    trace_mark(trace_ptr, clock_ptr, tl.program_id(0), ENDED, CLOCK)
    pdl_done(flags_ptr, launch, FLAGS)


@triton.jit
def _early_first_item(q_ptr, k_ptr, v_ptr, part_ptr, slots_ptr, context_ptr, path_ptr, path_len_ptr, scale, rows,
                      s_q_row, s_q_head, s_kv_slot, s_kv_head, s_kv_pos, s_path, s_part_row, s_part_head, s_part_block,
                      trace_ptr, clock_ptr, flags_ptr, launch, before, KV_HEADS: tl.constexpr, ROWS_PAD: tl.constexpr,
                      GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, DIM: tl.constexpr, KEY_BLOCK: tl.constexpr,
                      PRECISION: tl.constexpr, PDL: tl.constexpr, CLOCK: tl.constexpr, FLAGS: tl.constexpr):
    # EARLY's start of a worklist wave's program: its first item begun before the wait and
    # finished after it (its partial stored). The pass's blocks, and that item's row and KV
    # head and whether there was one.
    blocks, ends, row, kv_head, block, offsets, inside, early, k_early, v_early = _early_start(
        k_ptr, v_ptr, slots_ptr, context_ptr, path_ptr, path_len_ptr, rows, s_kv_slot, s_kv_head, s_kv_pos,
        s_path, trace_ptr, clock_ptr, flags_ptr, launch, before, KV_HEADS, ROWS_PAD, DIM, KEY_BLOCK, PDL, CLOCK,
        FLAGS)
    has = tl.program_id(0) < tl.sum(blocks, axis=0) * KV_HEADS
    if has:
        _late_partial(q_ptr, k_ptr, v_ptr, part_ptr, row, kv_head, block, offsets, inside, early, k_early, v_early,
                      scale, s_q_row, s_q_head, s_part_row, s_part_head, s_part_block, GROUP, GROUP_PAD, DIM,
                      PRECISION)
    return blocks, ends, row, kv_head, has


@triton.jit
def _early_start(k_ptr, v_ptr, slots_ptr, context_ptr, path_ptr, path_len_ptr, rows, s_kv_slot, s_kv_head, s_kv_pos,
                 s_path, trace_ptr, clock_ptr, flags_ptr, launch, before, KV_HEADS: tl.constexpr,
                 ROWS_PAD: tl.constexpr, DIM: tl.constexpr, KEY_BLOCK: tl.constexpr, PDL: tl.constexpr,
                 CLOCK: tl.constexpr, FLAGS: tl.constexpr):
    # _wave_start with the program's first item begun before the wait (_early_keys): the
    # pass's blocks, and that item's place, keys and values so far.
    trace_mark(trace_ptr, clock_ptr, tl.program_id(0), START, CLOCK)
    pdl_start(PDL)
    blocks, ends = _pass_blocks(context_ptr, path_len_ptr, rows, ROWS_PAD, KEY_BLOCK, ".cg")
    row, kv_head, block, offsets, inside, early, k, v = _early_keys(
        tl.program_id(0), tl.sum(blocks, axis=0) * KV_HEADS, blocks, ends, k_ptr, v_ptr, slots_ptr, context_ptr,
        path_ptr, path_len_ptr, rows, s_kv_slot, s_kv_head, s_kv_pos, s_path, KV_HEADS, ROWS_PAD, DIM, KEY_BLOCK)
    pdl_wait_for(flags_ptr, launch, before, PDL, FLAGS)
    trace_mark(trace_ptr, clock_ptr, tl.program_id(0), WAITED, CLOCK)
    return blocks, ends, row, kv_head, block, offsets, inside, early, k, v


@triton.jit(do_not_specialize=COUNTED)
def _row_attention_fold_kernel(q_ptr, k_ptr, v_ptr, part_ptr, out_ptr, count_ptr, slots_ptr, context_ptr, path_ptr,
                               path_len_ptr, scale, rows, s_q_row, s_q_head, s_kv_slot, s_kv_head, s_kv_pos, s_path,
                               s_part_row, s_part_head, s_part_block, s_out_row, s_out_head, trace_ptr, clock_ptr,
                               flags_ptr, launch, before, KV_HEADS: tl.constexpr, ROWS_PAD: tl.constexpr,
                               GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEADS_PAD: tl.constexpr,
                               DIM: tl.constexpr, KEY_BLOCK: tl.constexpr, PRECISION: tl.constexpr,
                               CHUNK: tl.constexpr, PDL: tl.constexpr, CLOCK: tl.constexpr, FLAGS: tl.constexpr,
                               EARLY: tl.constexpr, ROWS: tl.constexpr):
    # The `fold` schedule: the worklist's items, then the combine of a (row, KV head)'s
    # query heads by the program that stored its last block (an atomic count per pair
    # after a CTA barrier, acq_rel at GPU scope, reset by that program: row_linear's fold),
    # all GROUP heads at once. One launch a layer, not two; rows with no keys get zeros.
    # EARLY: a program's first item begun before the wait (_early_keys). ROWS > 1: groups
    # of that many consecutive rows read their shared key blocks once (_rows_work).
    if ROWS > 1:
        _rows_pass(q_ptr, k_ptr, v_ptr, part_ptr, out_ptr, count_ptr, slots_ptr, context_ptr, path_ptr, path_len_ptr,
                   scale, rows, s_q_row, s_q_head, s_kv_slot, s_kv_head, s_kv_pos, s_path, s_part_row, s_part_head,
                   s_part_block, s_out_row, s_out_head, trace_ptr, clock_ptr, flags_ptr, launch, before, KV_HEADS,
                   ROWS_PAD, GROUP, GROUP_PAD, HEADS_PAD, DIM, KEY_BLOCK, PRECISION, CHUNK, PDL, CLOCK, FLAGS, ROWS,
                   True)
    elif EARLY:
        blocks, ends, row, kv_head, has = _early_first_item(
            q_ptr, k_ptr, v_ptr, part_ptr, slots_ptr, context_ptr, path_ptr, path_len_ptr, scale, rows, s_q_row,
            s_q_head, s_kv_slot, s_kv_head, s_kv_pos, s_path, s_part_row, s_part_head, s_part_block, trace_ptr,
            clock_ptr, flags_ptr, launch, before, KV_HEADS, ROWS_PAD, GROUP, GROUP_PAD, DIM, KEY_BLOCK, PRECISION, PDL,
            CLOCK, FLAGS)
    else:
        blocks, ends = _wave_start(context_ptr, path_len_ptr, rows, trace_ptr, clock_ptr, flags_ptr, launch, before,
                                   ROWS_PAD, KEY_BLOCK, PDL, CLOCK, FLAGS)
    if ROWS == 1:
        zero_keyless_rows(out_ptr, blocks, rows, s_out_row, s_out_head, GROUP * KV_HEADS, HEADS_PAD, DIM, ROWS_PAD)
        r = tl.arange(0, ROWS_PAD)
        first = tl.program_id(0)
        if EARLY:
            if has:  # its partial stored: count it, and combine where it was the pair's last
                _fold_item(out_ptr, part_ptr, count_ptr, row, kv_head, blocks, r, s_out_row, s_out_head, s_part_row,
                           s_part_head, s_part_block, KV_HEADS, GROUP, GROUP_PAD, DIM, CHUNK)
            first += tl.num_programs(0)
        for item in range(first, tl.sum(blocks, axis=0) * KV_HEADS, tl.num_programs(0)):
            # (names of their own: EARLY's row and head are not the loop's to carry)
            item_row, item_head = _work_item(item, blocks, ends, q_ptr, k_ptr, v_ptr, part_ptr, slots_ptr,
                                             context_ptr, path_ptr, path_len_ptr, scale, s_q_row, s_q_head, s_kv_slot,
                                             s_kv_head, s_kv_pos, s_path, s_part_row, s_part_head, s_part_block,
                                             KV_HEADS, ROWS_PAD, GROUP, GROUP_PAD, DIM, KEY_BLOCK, PRECISION)
            _fold_item(out_ptr, part_ptr, count_ptr, item_row, item_head, blocks, r, s_out_row, s_out_head,
                       s_part_row, s_part_head, s_part_block, KV_HEADS, GROUP, GROUP_PAD, DIM, CHUNK)
    trace_mark(trace_ptr, clock_ptr, tl.program_id(0), ENDED, CLOCK)
    pdl_done(flags_ptr, launch, FLAGS)


@triton.jit
def _fold_item(out_ptr, part_ptr, count_ptr, row, kv_head, blocks, r, s_out_row, s_out_head, s_part_row, s_part_head,
               s_part_block, KV_HEADS: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, DIM: tl.constexpr,
               CHUNK: tl.constexpr):
    # After an item's partial is stored: count it, and where it was the (row, KV head)'s
    # last, combine the pair's partials and zero its count for the next launch.
    row_blocks = tl.sum(tl.where(r == row, blocks, 0), axis=0)
    tl.debug_barrier()  # every thread's partial stored before the count says so
    count = count_ptr + row * KV_HEADS + kv_head
    if tl.atomic_add(count, 1, sem="acq_rel", scope="gpu") == row_blocks - 1:
        _combine_group(out_ptr, part_ptr, row, kv_head, row_blocks, s_out_row, s_out_head, s_part_row,
                       s_part_head, s_part_block, GROUP, GROUP_PAD, DIM, CHUNK)
        tl.atomic_xchg(count, 0, sem="relaxed", scope="gpu")  # zero for the next launch


def row_attention(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, slots: torch.Tensor,
                  context: torch.Tensor, path: torch.Tensor, path_len: torch.Tensor, scale: float,
                  out: torch.Tensor, key_block: int, block_programs: int, schedule: str, programs: int,
                  work_warps: int, pdl: bool = False, counts: torch.Tensor | None = None,
                  fold_chunk: int = 8, trace: TakeTrace | None = None, flags: TakeFlag | None = None,
                  early: bool = False, item_rows: int = 1) -> None:
    rows, heads, dim = query.shape
    kv_heads = keys.shape[1]
    group = heads // kv_heads
    blocks = triton.cdiv(keys.shape[2], key_block)  # the most a row can have: its keys lie in its slot
    # [rows, heads, blocks, 2 + dim]: each block's max score, sum of weights, weighted values
    part = torch.empty(rows, heads, blocks, 2 + dim, dtype=torch.float32, device=query.device)
    strides = (query.stride(0), query.stride(1), keys.stride(0), keys.stride(1), keys.stride(2), path.stride(0),
               part.stride(0), part.stride(1), part.stride(2))
    launch = dict(PDL=pdl, **launch_options(pdl))
    shapes = dict(GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)), DIM=dim, KEY_BLOCK=key_block,
                  PRECISION="ieee" if query.dtype == torch.float32 else "tf32")

    def hooks(part_: str, grid: tuple[int, ...]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return launch_hooks(trace, flags, part_, math.prod(grid), out)  # kernels/_triton_trace.py

    if schedule == "fold":
        pointers, hooked = hooks("", (programs,))
        _row_attention_fold_kernel[(programs,)](
            query, keys, values, part, out, counts, slots, context, path, path_len, float(scale), rows, *strides,
            out.stride(0), out.stride(1), *pointers, KV_HEADS=kv_heads, ROWS_PAD=triton.next_power_of_2(rows),
            HEADS_PAD=triton.next_power_of_2(heads), CHUNK=fold_chunk, EARLY=early, ROWS=rows_of(item_rows, rows),
            num_warps=work_warps, **shapes, **launch, **hooked)
        return
    if schedule == "worklist":
        pointers, hooked = hooks("", (programs,))
        _row_attention_work_kernel[(programs,)](
            query, keys, values, part, slots, context, path, path_len, float(scale), rows, *strides, *pointers,
            KV_HEADS=kv_heads, ROWS_PAD=triton.next_power_of_2(rows), EARLY=early, ROWS=rows_of(item_rows, rows),
            num_warps=work_warps, **shapes, **launch, **hooked)
    else:
        grid = (rows, kv_heads, min(blocks, block_programs))
        pointers, hooked = hooks("", grid)
        _row_attention_block_kernel[grid](
            query, keys, values, part, slots, context, path, path_len, float(scale), *strides, *pointers, **shapes,
            **launch, **hooked)
    # at the worklist's warps whatever the schedule: a reduction's order on the GPU follows
    # its layout, which follows the warps, and both schedules must give the same bits
    pointers, hooked = hooks("_combine", (rows, heads))
    _row_attention_combine_kernel[(rows, heads)](
        out, part, context, path_len, out.stride(0), out.stride(1), part.stride(0), part.stride(1), part.stride(2),
        *pointers, DIM=dim, KEY_BLOCK=key_block, CHUNK=16, num_warps=work_warps, **launch, **hooked)


def rows_of(item_rows: int, rows: int) -> int:
    """The rows an item carries: `item_rows`, at most the pass's rows padded to a power of
    two (the groups tile them)."""
    return min(item_rows, triton.next_power_of_2(rows))
