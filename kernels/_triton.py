"""The Triton kernels behind `accept`, `compact` and `tree_mask` (imported only when one
runs: on CUDA tensors, or on CPU under `TRITON_INTERPRET=1` in the tests).

Each launcher takes arguments its wrapper already checked."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_V = 1024  # vocabulary tile of the streaming argmax


@triton.jit
def _row_argmax(logits_ptr, row, vocab, BLOCK: tl.constexpr):
    """First index of the row's maximum, like torch.argmax (strict > across tiles)."""
    best_val = tl.full((), float("-inf"), tl.float32)
    best_idx = tl.full((), 0, tl.int64)
    for v0 in range(0, vocab, BLOCK):
        cols = v0 + tl.arange(0, BLOCK)
        tile = tl.load(logits_ptr + row * vocab + cols, mask=cols < vocab, other=float("-inf")).to(tl.float32)
        tile_max = tl.max(tile, axis=0)
        tile_idx = tl.argmax(tile, axis=0).to(tl.int64) + v0
        better = tile_max > best_val
        best_idx = tl.where(better, tile_idx, best_idx)
        best_val = tl.where(better, tile_max, best_val)
    return best_idx


@triton.jit
def _tree_accept_kernel(logits_ptr, offsets_ptr, sizes_ptr, tokens_ptr, parents_ptr,
                        accepted_ptr, path_ptr, bonus_ptr, vocab, max_nodes, BLOCK: tl.constexpr):
    b = tl.program_id(0)
    offset = tl.load(offsets_ptr + b)
    size = tl.load(sizes_ptr + b)
    choice = _row_argmax(logits_ptr, offset, vocab, BLOCK)
    last = tl.full((), 0, tl.int64)
    n = tl.full((), 0, tl.int64)
    for i in range(1, size):
        parent = tl.load(parents_ptr + b * max_nodes + i)
        token = tl.load(tokens_ptr + b * max_nodes + i)
        if (parent == last) & (token == choice):
            tl.store(path_ptr + b * (max_nodes - 1) + n, i)
            n += 1
            last = i
            choice = _row_argmax(logits_ptr, offset + i, vocab, BLOCK)
    tl.store(accepted_ptr + b, n)
    tl.store(bonus_ptr + b, choice)


def tree_accept(logits: torch.Tensor, offsets: torch.Tensor, sizes: torch.Tensor, tokens: torch.Tensor,
                parents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    batch, max_nodes = tokens.shape
    accepted = torch.zeros(batch, dtype=torch.int64, device=logits.device)
    path = torch.full((batch, max(max_nodes - 1, 1)), -1, dtype=torch.int64, device=logits.device)
    bonus = torch.zeros(batch, dtype=torch.int64, device=logits.device)
    _tree_accept_kernel[(batch,)](logits, offsets, sizes, tokens, parents, accepted, path, bonus,
                                  logits.shape[1], max_nodes, BLOCK=BLOCK_V)
    return accepted, path[:, : max_nodes - 1], bonus


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
