"""Row attention's items of several rows (CODESPEC_CUDA_ATTENTION_ROWS): a group of
consecutive rows of one slot reads the key blocks that lie wholly in every row's context
once, each row's partial computed from them in turn; the rest are one row an item. Launched
from the worklist and fold kernels (kernels/_triton_attention.py) with ROWS > 1."""

from __future__ import annotations

import triton
import triton.language as tl

from codespec.kernels._triton_attention_items import (_block_partial, _fold_item, _item_place, _query_group, _row_keys,
                                                      _store_partial, _wave_wait)
from codespec.kernels._triton_combine import zero_keyless_rows


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
