"""The Triton kernels behind `compact`, `tree_mask`, `row_attention` and `rope_store`
(imported only when one runs: on CUDA tensors, or on CPU under `TRITON_INTERPRET=1` in
the tests; `row_linear`'s are in _triton_linear.py).

Each launcher takes arguments its wrapper already checked."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _compact_kernel(kv_ptr, slots_ptr, starts_ptr, src_ptr, n_keep_ptr, heads, max_keep,
                    s_slot, s_head, s_token, head_dim, BLOCK_D: tl.constexpr):
    pid = tl.program_id(0)  # one program per (request, head); ascending j keeps it in place
    b = pid // heads
    h = pid % heads
    slot = tl.load(slots_ptr + b)
    start = tl.load(starts_ptr + b)
    n = tl.load(n_keep_ptr + b)
    dims = tl.arange(0, BLOCK_D)
    base = kv_ptr + slot * s_slot + h * s_head
    for j in range(0, n):
        src = tl.load(src_ptr + b * max_keep + j)
        if src != j:
            row = tl.load(base + (start + src) * s_token + dims, mask=dims < head_dim)
            tl.store(base + (start + j) * s_token + dims, row, mask=dims < head_dim)


def compact_kv(kv: torch.Tensor, slots: torch.Tensor, starts: torch.Tensor, src: torch.Tensor,
               n_keep: torch.Tensor) -> None:
    _, heads, _, head_dim = kv.shape
    grid = (slots.shape[0] * heads,)
    _compact_kernel[grid](kv, slots, starts, src, n_keep, heads, src.shape[1],
                          kv.stride(0), kv.stride(1), kv.stride(2), head_dim,
                          BLOCK_D=triton.next_power_of_2(head_dim))


@triton.jit
def _tree_mask_kernel(parents_ptr, sizes_ptr, allow_ptr, max_nodes):
    pid = tl.program_id(0)  # one program per (request, node): walk up to the root
    b = pid // max_nodes
    i = pid % max_nodes
    size = tl.load(sizes_ptr + b)
    row = allow_ptr + b * max_nodes * max_nodes + i * max_nodes
    tl.store(row + i, 1)
    node = tl.where(i < size, tl.load(parents_ptr + b * max_nodes + i), -1)
    for _ in range(0, max_nodes):
        if node >= 0:
            tl.store(row + node, 1)
            node = tl.load(parents_ptr + b * max_nodes + node)


def tree_mask(parents: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
    batch, max_nodes = parents.shape
    allow = torch.zeros(batch, max_nodes, max_nodes, dtype=torch.int8, device=parents.device)
    _tree_mask_kernel[(batch * max_nodes,)](parents, sizes, allow, max_nodes)
    return allow.bool()


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
    # it holds and how it is summed depend on the row's keys alone. Both launch schedules
    # below run exactly this code for every block.
    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, DIM)
    head = kv_head * GROUP + g
    real = g < GROUP
    base = slot * s_kv_slot + kv_head * s_kv_head
    t = block * KEY_BLOCK + tl.arange(0, KEY_BLOCK)
    inside = t < total
    on_path = t >= context
    step = tl.load(path_ptr + row * s_path + (t - context), mask=inside & on_path, other=0)
    position = tl.where(on_path, step, t)
    offsets = base + position[:, None] * s_kv_pos + d[None, :]
    k = tl.load(k_ptr + offsets, mask=inside[:, None], other=0.0).to(tl.float32)
    v = tl.load(v_ptr + offsets, mask=inside[:, None], other=0.0).to(tl.float32)
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
def _row_attention_block_kernel(q_ptr, k_ptr, v_ptr, part_ptr, slots_ptr, context_ptr, path_ptr, path_len_ptr,
                                scale, s_q_row, s_q_head, s_kv_slot, s_kv_head, s_kv_pos, s_path,
                                s_part_row, s_part_head, s_part_block,
                                GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, DIM: tl.constexpr,
                                KEY_BLOCK: tl.constexpr, PRECISION: tl.constexpr):
    # The `grid` schedule: one program per (row, KV head, program of the block axis),
    # taking the row's key blocks b = program, program + programs, ...
    row = tl.program_id(0)
    kv_head = tl.program_id(1)
    slot = tl.load(slots_ptr + row)
    context = tl.load(context_ptr + row)
    total = context + tl.load(path_len_ptr + row)
    q = _query_group(q_ptr, row, kv_head, s_q_row, s_q_head, GROUP, GROUP_PAD, DIM)
    for block in range(tl.program_id(2), tl.cdiv(total, KEY_BLOCK), tl.num_programs(2)):
        _block_partial(q, k_ptr, v_ptr, part_ptr, path_ptr, row, kv_head, slot, context, total, block, scale,
                       s_kv_slot, s_kv_head, s_kv_pos, s_path, s_part_row, s_part_head, s_part_block,
                       GROUP, GROUP_PAD, DIM, KEY_BLOCK, PRECISION)


@triton.jit
def _row_attention_work_kernel(q_ptr, k_ptr, v_ptr, part_ptr, slots_ptr, context_ptr, path_ptr, path_len_ptr,
                               scale, rows, s_q_row, s_q_head, s_kv_slot, s_kv_head, s_kv_pos, s_path,
                               s_part_row, s_part_head, s_part_block, KV_HEADS: tl.constexpr,
                               ROWS_PAD: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
                               DIM: tl.constexpr, KEY_BLOCK: tl.constexpr, PRECISION: tl.constexpr):
    # The `worklist` schedule: a fixed number of programs (a wave of the device) share the
    # pass's real work, the (row, key block, KV head) items in that order, item i going to
    # program i mod programs. Padding rows have no blocks, so they add no programs: a
    # one-row step over 512 keys is 8 items, not the grid's rows * KV heads * 16 programs.
    r = tl.arange(0, ROWS_PAD)
    listed = r < rows
    blocks = tl.cdiv(tl.load(context_ptr + r, mask=listed, other=0) + tl.load(path_len_ptr + r, mask=listed,
                                                                              other=0), KEY_BLOCK)
    ends = tl.cumsum(blocks, axis=0)  # each row's blocks end here in the flat list
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
                                  s_part_row, s_part_head, s_part_block,
                                  DIM: tl.constexpr, KEY_BLOCK: tl.constexpr, CHUNK: tl.constexpr):
    # One program per (row, query head): the row's block partials in block order, CHUNK at
    # a time (a fixed tree within a chunk, chunks in order): the row's keys fix the order.
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
                  out: torch.Tensor, key_block: int, block_programs: int, schedule: str, programs: int,
                  work_warps: int) -> None:
    rows, heads, dim = query.shape
    kv_heads = keys.shape[1]
    group = heads // kv_heads
    blocks = triton.cdiv(keys.shape[2], key_block)  # the most a row can have: its keys lie in its slot
    # [rows, heads, blocks, 2 + dim]: each block's max score, sum of weights, weighted values
    part = torch.empty(rows, heads, blocks, 2 + dim, dtype=torch.float32, device=query.device)
    strides = (query.stride(0), query.stride(1), keys.stride(0), keys.stride(1), keys.stride(2), path.stride(0),
               part.stride(0), part.stride(1), part.stride(2))
    shapes = dict(GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)), DIM=dim, KEY_BLOCK=key_block,
                  PRECISION="ieee" if query.dtype == torch.float32 else "tf32")
    if schedule == "worklist":
        _row_attention_work_kernel[(programs,)](
            query, keys, values, part, slots, context, path, path_len, float(scale), rows, *strides,
            KV_HEADS=kv_heads, ROWS_PAD=triton.next_power_of_2(rows), num_warps=work_warps, **shapes)
    else:
        _row_attention_block_kernel[(rows, kv_heads, min(blocks, block_programs))](
            query, keys, values, part, slots, context, path, path_len, float(scale), *strides, **shapes)
    _row_attention_combine_kernel[(rows, heads)](
        out, part, context, path_len, out.stride(0), out.stride(1), part.stride(0), part.stride(1), part.stride(2),
        DIM=dim, KEY_BLOCK=key_block, CHUNK=16)


@triton.jit
def _rope_store_kernel(qkv_ptr, cos_ptr, sin_ptr, source_ptr, write_slot_ptr, write_position_ptr, q_ptr, k_ptr, v_ptr,
                       s_qkv, s_rope, s_q_row, s_q_head, s_kv_slot, s_kv_head, s_kv_pos,
                       HEADS: tl.constexpr, KV_HEADS: tl.constexpr, DIM: tl.constexpr):
    # One program per (row, head of q, k or v). Rotary as transformers applies it in the
    # model's dtype: x * cos and rotate_half(x) * sin each rounded, then their sum rounded.
    row = tl.program_id(0)
    head = tl.program_id(1)
    d = tl.arange(0, DIM)
    half = DIM // 2
    src = tl.where(head < HEADS, row, tl.load(source_ptr + row))  # padding rows store their source row's K, V
    base = qkv_ptr + src * s_qkv + head * DIM
    x = tl.load(base + d)
    if head < HEADS + KV_HEADS:
        partner = tl.load(base + (d + half) % DIM)
        rotated = tl.where(d < half, -partner.to(tl.float32), partner.to(tl.float32)).to(x.dtype)
        cos = tl.load(cos_ptr + src * s_rope + d)
        sin = tl.load(sin_ptr + src * s_rope + d)
        first = (x.to(tl.float32) * cos.to(tl.float32)).to(x.dtype)
        second = (rotated.to(tl.float32) * sin.to(tl.float32)).to(x.dtype)
        x = (first.to(tl.float32) + second.to(tl.float32)).to(x.dtype)
    if head < HEADS:
        tl.store(q_ptr + row * s_q_row + head * s_q_head + d, x)
    else:
        kv_head = (head - HEADS) % KV_HEADS
        at = tl.load(write_slot_ptr + row) * s_kv_slot + kv_head * s_kv_head + tl.load(write_position_ptr + row) * s_kv_pos
        if head < HEADS + KV_HEADS:
            tl.store(k_ptr + at + d, x)
        else:
            tl.store(v_ptr + at + d, x)


def rope_store(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, source: torch.Tensor,
               write_slots: torch.Tensor, write_positions: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
               q: torch.Tensor, heads: int, kv_heads: int) -> None:
    rows, dim = q.shape[0], q.shape[2]
    _rope_store_kernel[(rows, heads + 2 * kv_heads)](
        qkv, cos, sin, source, write_slots, write_positions, q, keys, values,
        qkv.stride(0), cos.stride(0), q.stride(0), q.stride(1), keys.stride(0), keys.stride(1), keys.stride(2),
        HEADS=heads, KV_HEADS=kv_heads, DIM=dim)
