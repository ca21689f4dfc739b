"""The Triton kernels behind `compact` and `tree_mask` (imported only when one
runs: on CUDA tensors, or on CPU under `TRITON_INTERPRET=1` in the tests).

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
def _row_attention_kernel(q_ptr, k_ptr, v_ptr, out_ptr, slots_ptr, context_ptr, path_ptr, path_len_ptr, scale,
                          s_q_row, s_q_head, s_kv_slot, s_kv_head, s_kv_pos, s_out_row, s_out_head, s_path,
                          GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, DIM: tl.constexpr,
                          KEY_BLOCK: tl.constexpr, PRECISION: tl.constexpr):
    # One program per (row, KV head): the GROUP query heads that share the KV head, padded
    # to GROUP_PAD (tl.dot needs 16). The loop runs over the row's logical keys in blocks
    # of KEY_BLOCK: the same order for a row wherever it sits and whatever the pass holds.
    row = tl.program_id(0)
    kv_head = tl.program_id(1)
    slot = tl.load(slots_ptr + row)
    context = tl.load(context_ptr + row)
    total = context + tl.load(path_len_ptr + row)
    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, DIM)
    head = kv_head * GROUP + g
    real = g < GROUP
    # Operands in float32: a bf16 or fp16 value is exact in tf32, so tf32 products of them
    # are exact too (the weights round to tf32, finer than bf16).
    q = tl.load(q_ptr + row * s_q_row + head[:, None] * s_q_head + d[None, :], mask=real[:, None],
                other=0.0).to(tl.float32)
    base = slot * s_kv_slot + kv_head * s_kv_head
    best = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    total_weight = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, DIM], tl.float32)
    for begin in range(0, total, KEY_BLOCK):
        t = begin + tl.arange(0, KEY_BLOCK)
        inside = t < total
        on_path = t >= context
        step = tl.load(path_ptr + row * s_path + (t - context), mask=inside & on_path, other=0)
        position = tl.where(on_path, step, t)
        offsets = base + position[:, None] * s_kv_pos + d[None, :]
        k = tl.load(k_ptr + offsets, mask=inside[:, None], other=0.0).to(tl.float32)
        v = tl.load(v_ptr + offsets, mask=inside[:, None], other=0.0).to(tl.float32)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
        scores = tl.where(inside[None, :], scores, float("-inf"))
        new_best = tl.maximum(best, tl.max(scores, axis=1))
        rescale = tl.exp(best - new_best)
        weights = tl.exp(scores - new_best[:, None])
        total_weight = total_weight * rescale + tl.sum(weights, axis=1)
        acc = acc * rescale[:, None] + tl.dot(weights, v, input_precision=PRECISION)
        best = new_best
    result = acc / tl.where(total_weight > 0, total_weight, 1.0)[:, None]  # no keys (padding): zeros
    tl.store(out_ptr + row * s_out_row + head[:, None] * s_out_head + d[None, :],
             result.to(out_ptr.dtype.element_ty), mask=real[:, None])


def row_attention(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, slots: torch.Tensor,
                  context: torch.Tensor, path: torch.Tensor, path_len: torch.Tensor, scale: float,
                  out: torch.Tensor, key_block: int) -> None:
    rows, heads, dim = query.shape
    kv_heads = keys.shape[1]
    group = heads // kv_heads
    _row_attention_kernel[(rows, kv_heads)](
        query, keys, values, out, slots, context, path, path_len, float(scale),
        query.stride(0), query.stride(1), keys.stride(0), keys.stride(1), keys.stride(2),
        out.stride(0), out.stride(1), path.stride(0),
        GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)), DIM=dim, KEY_BLOCK=key_block,
        PRECISION="ieee" if query.dtype == torch.float32 else "tf32")
