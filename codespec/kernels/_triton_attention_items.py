"""What one program of row attention's launches does with its work (kernels/_triton_attention.py
launches them): an item's key block and its softmax partial, where an item lies in the
pass's flat list, a worklist wave's start (its wait, and with EARLY its first item begun
before it), and the fold's count and combine after an item.

Every schedule, and every grouping of rows (kernels/_triton_attention_rows.py), computes a
block's partial through _store_partial from the same keys and values: the same bits."""

from __future__ import annotations

import triton
import triton.language as tl

from codespec.kernels._triton_combine import _combine_group
from codespec.kernels._triton_pdl import pdl_start, pdl_wait_for
from codespec.kernels._triton_trace import START, WAITED, trace_mark


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
def _block_partial(q, k_ptr, v_ptr, part_ptr, path_ptr, row, kv_head, slot, context, total, block, scale,
                   s_kv_slot, s_kv_head, s_kv_pos, s_path, s_part_row, s_part_head, s_part_block,
                   GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, DIM: tl.constexpr, KEY_BLOCK: tl.constexpr,
                   PRECISION: tl.constexpr):
    # One key block's softmax partial for a row's query group (max score, sum of weights,
    # weighted sum of values), written apart: a block is KEY_BLOCK *logical* keys, so what
    # it holds and how it is summed depend on the row's keys alone. Every launch schedule
    # (kernels/_triton_attention.py) runs exactly this arithmetic for every block (_store_partial).
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
