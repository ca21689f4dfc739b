"""The `walk` schedule of `row_attention` (kernels/row_attention.py; imported only when one
runs: on CUDA tensors, or on CPU under `TRITON_INTERPRET=1` in the tests).

Why. The H200's trace (session 38) put attention at 9.6 us of a layer's ~38 in a step
over 512 keys: a chain of round trips after the wait (the metadata, the query and the
path, the keys and values from HBM, the partials stored, the count's atomic, the
partials read back twice, the output), not bytes (256 KB a layer). Here a program walks
a *chunk* of WALK key blocks of a (row, KV head) in order, each block's keys and values
loaded by the loop's pipeline while the block before computes, with an online softmax
in registers: a row of at most WALK blocks (1,024 keys at WALK=8) writes its output
directly, with no partial, no count and no combine. A longer row's chunks fold as the
`fold` schedule's blocks do (the program that stores its last chunk combines them).
With PDL each program also warms its first item's keys and values into L2 while the
kernel before runs (the past keys no pass rewrites; a warmed line the kernel before
then writes is current in L2 all the same: a prefetch moves no value into a register).

Bits. A row's arithmetic is fixed by its own key count: its chunks are WALK blocks of
KEY_BLOCK logical keys, walked in order, folded in chunk order; neither the pass's rows
nor which program takes an item enter it. Its bits are its own, other than the fold's
and the worklist's (another summation order), the same for a verify row and the decode
step it stands for."""

from __future__ import annotations

import triton
import triton.language as tl

from codespec.kernels._triton import masked_metadata, metadata
from codespec.kernels._triton_attention import _combine_group, _pass_blocks, _query_group, zero_keyless_rows
from codespec.kernels._triton_linear import sector_prefetch
from codespec.kernels._triton_pdl import COUNTED, pdl_done, pdl_start, pdl_wait_for
from codespec.kernels._triton_trace import ENDED, START, WAITED, program_index, trace_mark

SECTOR = tl.constexpr(16)  # elements of a 32-byte sector (bf16): prefetch.global.L2's grain, as the products warm


@triton.jit
def _block_positions(path_ptr, row, context, total, block, s_path, KEY_BLOCK: tl.constexpr, EARLY: tl.constexpr):
    # Block `block`'s logical keys: their positions in the slot (the context's contiguous,
    # then the path's) and which are keys at all. EARLY: the path read before the wait,
    # through L2 (_triton.metadata; for the warming: an address, never a value).
    t = block * KEY_BLOCK + tl.arange(0, KEY_BLOCK)
    inside = t < total
    on_path = t >= context
    step = masked_metadata(path_ptr + row * s_path + (t - context), inside & on_path, EARLY)
    return tl.where(on_path, step, t), inside


@triton.jit
def _walk(q, k_ptr, v_ptr, path_ptr, row, kv_head, slot, context, total, first, last, scale, s_kv_slot, s_kv_head,
          s_kv_pos, s_path, GROUP_PAD: tl.constexpr, DIM: tl.constexpr, KEY_BLOCK: tl.constexpr,
          PRECISION: tl.constexpr):
    # Blocks first..last-1 of a row's query group in order, an online softmax: the running
    # maximum, the sum of weights and the weighted values under it ([GROUP_PAD], twice, and
    # [GROUP_PAD, DIM]). Each block holds at least one key, so the maximum is finite after
    # the first and its rescale of the empty start is exp(-inf) = 0.
    d = tl.arange(0, DIM)
    base = slot * s_kv_slot + kv_head * s_kv_head
    best = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    weight = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, DIM], tl.float32)
    for block in range(first, last):
        position, inside = _block_positions(path_ptr, row, context, total, block, s_path, KEY_BLOCK, False)
        offsets = base + position[:, None] * s_kv_pos + d[None, :]
        k = tl.load(k_ptr + offsets, mask=inside[:, None], other=0.0).to(tl.float32)
        v = tl.load(v_ptr + offsets, mask=inside[:, None], other=0.0).to(tl.float32)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
        scores = tl.where(inside[None, :], scores, float("-inf"))
        top = tl.maximum(best, tl.max(scores, axis=1))
        rescale = tl.exp(best - top)
        weights = tl.exp(scores - top[:, None])
        weight = weight * rescale + tl.sum(weights, axis=1)
        acc = acc * rescale[:, None] + tl.dot(weights, v, input_precision=PRECISION)
        best = top
    return best, weight, acc


@triton.jit
def _pass_chunks(context_ptr, path_len_ptr, rows, ROWS_PAD: tl.constexpr, KEY_BLOCK: tl.constexpr,
                 WALK: tl.constexpr, EARLY: tl.constexpr):
    # Each row's chunks ([ROWS_PAD], 0 for padding and past the pass's rows) and where
    # each row's chunks end in the pass's flat list of them. EARLY: through L2.
    blocks, _ = _pass_blocks(context_ptr, path_len_ptr, rows, ROWS_PAD, KEY_BLOCK, EARLY)
    chunks = tl.cdiv(blocks, WALK)
    return chunks, tl.cumsum(chunks, axis=0)


@triton.jit
def _item(item, chunks, ends, KV_HEADS: tl.constexpr, ROWS_PAD: tl.constexpr):
    # Item `item` of the pass's (row, chunk, KV head) list, in that order.
    flat = item // KV_HEADS
    row = tl.sum((ends <= flat).to(tl.int32), axis=0)  # the rows whose chunks all come before
    chunk = flat - tl.sum(tl.where(tl.arange(0, ROWS_PAD) < row, chunks, 0), axis=0)
    return row, chunk, item % KV_HEADS


@triton.jit
def _warm_item(k_ptr, v_ptr, slots_ptr, context_ptr, path_ptr, path_len_ptr, chunks, ends, s_kv_slot, s_kv_head,
               s_kv_pos, s_path, KV_HEADS: tl.constexpr, ROWS_PAD: tl.constexpr, DIM: tl.constexpr,
               KEY_BLOCK: tl.constexpr, WALK: tl.constexpr):
    # This program's first item's keys and values into L2, before the wait, from the
    # pass's chunks read before it (_pass_chunks, through L2): every read here is an
    # address, through L2 (metadata a stale L1 line could hold would warm the wrong lines,
    # never change a value).
    item = tl.program_id(0)
    if item < tl.sum(chunks, axis=0) * KV_HEADS:
        row, chunk, kv_head = _item(item, chunks, ends, KV_HEADS, ROWS_PAD)
        context = metadata(context_ptr + row, True)
        total = context + metadata(path_len_ptr + row, True)
        base = metadata(slots_ptr + row, True) * s_kv_slot + kv_head * s_kv_head
        sector = tl.arange(0, DIM // SECTOR) * SECTOR
        first = chunk * WALK
        for block in range(first, tl.minimum(first + WALK, tl.cdiv(total, KEY_BLOCK))):
            position, inside = _block_positions(path_ptr, row, context, total, block, s_path, KEY_BLOCK, True)
            offsets = base + position[:, None] * s_kv_pos + sector[None, :]
            at = inside[:, None] & (sector[None, :] >= 0)
            sector_prefetch(k_ptr + offsets, at)
            sector_prefetch(v_ptr + offsets, at)


@triton.jit(do_not_specialize=COUNTED)
def _row_attention_walk_kernel(q_ptr, k_ptr, v_ptr, part_ptr, out_ptr, count_ptr, slots_ptr, context_ptr, path_ptr,
                               path_len_ptr, scale, rows, s_q_row, s_q_head, s_kv_slot, s_kv_head, s_kv_pos, s_path,
                               s_part_row, s_part_head, s_part_block, s_out_row, s_out_head, trace_ptr, clock_ptr,
                               flags_ptr, launch, before, KV_HEADS: tl.constexpr, ROWS_PAD: tl.constexpr,
                               GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEADS_PAD: tl.constexpr,
                               DIM: tl.constexpr, KEY_BLOCK: tl.constexpr, WALK: tl.constexpr,
                               PRECISION: tl.constexpr, CHUNK: tl.constexpr, PDL: tl.constexpr, CLOCK: tl.constexpr,
                               EARLY: tl.constexpr, FLAGS: tl.constexpr, WARM: tl.constexpr):
    # A wave of programs shares the pass's (row, chunk, KV head) items, item i going to
    # program i mod programs (the module docstring). WARM: the first item's keys and values
    # into L2 before the wait; EARLY: the chunks from the metadata read before it.
    program = program_index()
    trace_mark(trace_ptr, clock_ptr, program, START, CLOCK)
    pdl_start(PDL)
    if EARLY or WARM:  # read once before the wait, for the warming and (EARLY) the items
        chunks, ends = _pass_chunks(context_ptr, path_len_ptr, rows, ROWS_PAD, KEY_BLOCK, WALK, True)
    if WARM:
        _warm_item(k_ptr, v_ptr, slots_ptr, context_ptr, path_ptr, path_len_ptr, chunks, ends, s_kv_slot, s_kv_head,
                   s_kv_pos, s_path, KV_HEADS, ROWS_PAD, DIM, KEY_BLOCK, WALK)
    pdl_wait_for(flags_ptr, launch, before, PDL, FLAGS)
    trace_mark(trace_ptr, clock_ptr, program, WAITED, CLOCK)
    if not EARLY:
        chunks, ends = _pass_chunks(context_ptr, path_len_ptr, rows, ROWS_PAD, KEY_BLOCK, WALK, False)
    zero_keyless_rows(out_ptr, chunks, rows, s_out_row, s_out_head, GROUP * KV_HEADS, HEADS_PAD, DIM, ROWS_PAD)
    r = tl.arange(0, ROWS_PAD)
    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, DIM)
    for item in range(tl.program_id(0), tl.sum(chunks, axis=0) * KV_HEADS, tl.num_programs(0)):
        row, chunk, kv_head = _item(item, chunks, ends, KV_HEADS, ROWS_PAD)
        row_chunks = tl.sum(tl.where(r == row, chunks, 0), axis=0)
        slot = tl.load(slots_ptr + row)
        context = tl.load(context_ptr + row)
        total = context + tl.load(path_len_ptr + row)
        q = _query_group(q_ptr, row, kv_head, s_q_row, s_q_head, GROUP, GROUP_PAD, DIM)
        first = chunk * WALK
        best, weight, acc = _walk(q, k_ptr, v_ptr, path_ptr, row, kv_head, slot, context, total, first,
                                  tl.minimum(first + WALK, tl.cdiv(total, KEY_BLOCK)), scale, s_kv_slot, s_kv_head,
                                  s_kv_pos, s_path, GROUP_PAD, DIM, KEY_BLOCK, PRECISION)
        head = kv_head * GROUP + g
        real = g < GROUP
        if row_chunks == 1:  # the row's whole softmax: its output
            tl.store(out_ptr + row * s_out_row + head[:, None] * s_out_head + d[None, :],
                     (acc / weight[:, None]).to(out_ptr.dtype.element_ty), mask=real[:, None])
        else:  # the chunk's partial, as a fold's block's; the last chunk stored combines them
            at = part_ptr + row * s_part_row + head * s_part_head + chunk * s_part_block
            tl.store(at, best, mask=real)
            tl.store(at + 1, weight, mask=real)
            tl.store(at[:, None] + 2 + d[None, :], acc, mask=real[:, None])
            tl.debug_barrier()  # every thread's partial stored before the count says so
            count = count_ptr + row * KV_HEADS + kv_head
            if tl.atomic_add(count, 1, sem="acq_rel", scope="gpu") == row_chunks - 1:
                _combine_group(out_ptr, part_ptr, row, kv_head, row_chunks, s_out_row, s_out_head, s_part_row,
                               s_part_head, s_part_block, GROUP, GROUP_PAD, DIM, CHUNK)
                tl.atomic_xchg(count, 0, sem="relaxed", scope="gpu")  # zero for the next launch
    trace_mark(trace_ptr, clock_ptr, program, ENDED, CLOCK)
    pdl_done(flags_ptr, launch, FLAGS)
