"""The ancestor-or-self mask of a batch of draft trees.

allow[b, i, j] is True when node j is node i itself or one of its ancestors (node i
may attend to node j's keys). Rows past `sizes[b]` are padding and see only themselves,
which keeps a softmax over them finite.

>>> tree_mask(torch.tensor([[-1, 0, 0, 1]]), torch.tensor([4])).int()[0].tolist()
[[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]]
"""

from __future__ import annotations

import torch

from codespec.kernels import check, use_triton


def tree_mask(
    parents: torch.Tensor,  # [batch, max_nodes] int64, parents[b, i] < i, -1 for roots
    sizes: torch.Tensor,  # [batch] int64
    *,
    force_triton: bool | None = None,
) -> torch.Tensor:
    """Returns allow: [batch, max_nodes, max_nodes] bool."""
    check(parents.dim() == 2 and parents.dtype == torch.int64 and parents.is_contiguous(),
          "parents must be a contiguous int64 [batch, max_nodes] tensor")
    check(sizes.shape == parents.shape[:1] and sizes.dtype == torch.int64 and sizes.device == parents.device,
          "sizes must be int64 [batch] on the parents' device")
    if use_triton(parents, force_triton):
        from codespec.kernels import _triton

        return _triton.tree_mask(parents, sizes)
    return tree_mask_ref(parents, sizes)


def tree_mask_ref(parents: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
    batch, max_nodes = parents.shape
    allow = torch.eye(max_nodes, dtype=torch.bool, device=parents.device).repeat(batch, 1, 1)
    rows = parents.tolist()
    for b, size in enumerate(sizes.tolist()):
        for i in range(1, size):  # topological order: a parent's row is complete first
            parent = rows[b][i]
            if parent >= 0:
                allow[b, i] |= allow[b, parent]
    return allow
