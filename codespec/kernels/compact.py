"""KV compaction: after a tree verify pass, each request keeps only its accepted path.

A request's pass wrote node i's keys and values at slot position `starts[b] + i`. The
accepted path's nodes `src[b, :n_keep[b]]` (ascending node indices, node 0 first) move
to positions `starts[b] + 0 .. n_keep[b] - 1`; the rest is left as garbage past the
slot's length. Because src[j] >= j, copying in ascending j never overwrites a source
still to be read.

>>> kv = torch.arange(8.).reshape(1, 1, 8, 1)           # [slots, heads, tokens, dim]
>>> compact_kv(kv, torch.tensor([0]), torch.tensor([2]), torch.tensor([[0, 2, 5]]), torch.tensor([3]))
>>> kv.flatten().tolist()                               # positions 2, 4, 7 moved to 2, 3, 4
[0.0, 1.0, 2.0, 4.0, 7.0, 5.0, 6.0, 7.0]
"""

from __future__ import annotations

import torch

from codespec.kernels import check, use_triton


def compact_kv(
    kv: torch.Tensor,  # [slots, kv_heads, slot_tokens, head_dim], modified in place
    slots: torch.Tensor,  # [batch] int64
    starts: torch.Tensor,  # [batch] int64, the slot's length before the pass
    src: torch.Tensor,  # [batch, max_keep] int64, kept node indices, ascending
    n_keep: torch.Tensor,  # [batch] int64
    *,
    force_triton: bool | None = None,
) -> None:
    check(kv.dim() == 4 and kv.is_contiguous(), "kv must be a contiguous [slots, heads, tokens, dim] tensor")
    batch = slots.shape[0]
    check(src.dim() == 2 and src.shape[0] == batch, "src must be [batch, max_keep]")
    for t in (slots, starts, src, n_keep):
        check(t.dtype == torch.int64 and t.is_contiguous() and t.device == kv.device,
              "index tensors must be contiguous int64 on the cache's device")
    check(starts.shape == (batch,) and n_keep.shape == (batch,), "starts and n_keep must be [batch]")
    if use_triton(kv, force_triton):
        from codespec.kernels import _triton

        _triton.compact_kv(kv, slots, starts, src, n_keep)
    else:
        compact_kv_ref(kv, slots, starts, src, n_keep)


def compact_kv_ref(kv: torch.Tensor, slots: torch.Tensor, starts: torch.Tensor, src: torch.Tensor,
                   n_keep: torch.Tensor) -> None:
    for slot, start, row, n in zip(slots.tolist(), starts.tolist(), src.tolist(), n_keep.tolist()):
        moved = [(j, s) for j, s in enumerate(row[:n]) if s != j]
        if not moved:
            continue  # a chain's accepted path is already in place
        dst = torch.tensor([start + j for j, _ in moved], device=kv.device)
        source = torch.tensor([start + s for _, s in moved], device=kv.device)
        kv[slot].index_copy_(1, dst, kv[slot].index_select(1, source))


def keep_paths(keys: list[torch.Tensor], values: list[torch.Tensor], moves) -> None:
    """The Forward protocol's `keep` over per-layer key and value tensors: each move
    (slot, start, accepted nodes) keeps node 0 at start and path[j] at start + 1 + j."""
    device = keys[0].device
    width = 1 + max(len(path) for _, _, path in moves)
    src = torch.tensor([[0, *path] + [-1] * (width - 1 - len(path)) for _, _, path in moves], device=device)
    slots = torch.tensor([slot for slot, _, _ in moves], device=device)
    starts = torch.tensor([start for _, start, _ in moves], device=device)
    keep = torch.tensor([1 + len(path) for _, _, path in moves], device=device)
    for layer_keys, layer_values in zip(keys, values):
        compact_kv(layer_keys, slots, starts, src, keep)
        compact_kv(layer_values, slots, starts, src, keep)
