"""The Triton kernels behind `row_attention` (kernels/row_attention.py; imported only when
one runs: on CUDA tensors, or on CPU under `TRITON_INTERPRET=1` in the tests): the launch
schedules (`grid`, `worklist`, `fold`) and their launcher. What a program does with an item
is in kernels/_triton_attention_items.py, items of several rows in _triton_attention_rows.py.

The launcher takes arguments its wrapper already checked."""

from __future__ import annotations

import math
from typing import Any

import torch
import triton
import triton.language as tl

from codespec.kernels._triton_attention_items import (_block_partial, _early_first_item, _fold_item, _query_group,
                                                      _row_keys, _wave_start, _work_item)
from codespec.kernels._triton_attention_rows import _rows_pass
from codespec.kernels._triton_combine import _row_attention_combine_kernel, zero_keyless_rows
from codespec.kernels._triton_pdl import COUNTED, launch_options, pdl_done
from codespec.kernels._triton_trace import ENDED, launch_hooks, trace_mark, waited_program
from codespec.kernels.flags import TakeFlag
from codespec.kernels.trace import TakeTrace


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
    # of that many consecutive rows read their shared key blocks once (_triton_attention_rows.py).
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
    # of that many consecutive rows read their shared key blocks once (_triton_attention_rows.py).
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
