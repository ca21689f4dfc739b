"""Greedy acceptance over a batch of draft trees.

Each request contributes `sizes[b]` consecutive rows of the packed logits, starting at
`offsets[b]`: node 0 is the pending token, nodes 1.. its draft tree in topological order
(`parents[b, i] < i`; node 0's parent is -1). Row i's argmax is the model's choice after
node i. Scanning the nodes in order, a node is accepted when its parent is the last
accepted node (node 0 to start) and its token is the model's choice there; siblings of
a trie carry distinct tokens, and with repeated ones the first wins. The result is the
accepted path (node indices, root excluded), its length, and the bonus token: the
model's choice after the path's last node. Only the path's rows need an argmax.

    logits rows  : argmax 5 (after node 0), 7 (node 1), 9 (node 2), 4 (node 3)
    tokens       : [pending, 5, 6, 7]   parents [-1, 0, 0, 1]
    accepted path: node 1 (token 5 == choice at 0), node 3 (7 == choice at 1); bonus 4

>>> lg = torch.zeros(4, 10); lg[0, 5] = lg[1, 7] = lg[2, 9] = lg[3, 4] = 1
>>> t = torch.tensor([[0, 5, 6, 7]]); p = torch.tensor([[-1, 0, 0, 1]])
>>> n, path, bonus = tree_accept(lg, torch.tensor([0]), torch.tensor([4]), t, p)
>>> n.tolist(), path.tolist(), bonus.tolist()
([2], [[1, 3, -1]], [4])
"""

from __future__ import annotations

import torch

from codespec.kernels import check, use_triton


def tree_accept(
    logits: torch.Tensor,  # [rows, vocab], every request's rows packed
    offsets: torch.Tensor,  # [batch] int64, first row of each request
    sizes: torch.Tensor,  # [batch] int64, rows (nodes) of each request, >= 1
    tokens: torch.Tensor,  # [batch, max_nodes] int64, node tokens (node 0: pending)
    parents: torch.Tensor,  # [batch, max_nodes] int64, -1 for node 0 and padding
    *,
    force_triton: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns (accepted [batch], path [batch, max_nodes - 1] with -1 padding, bonus [batch])."""
    check(logits.dim() == 2 and logits.is_contiguous(), "logits must be a contiguous [rows, vocab] tensor")
    check(tokens.shape == parents.shape and tokens.dim() == 2, "tokens and parents must be [batch, max_nodes]")
    batch, max_nodes = tokens.shape
    check(offsets.shape == (batch,) and sizes.shape == (batch,), "offsets and sizes must be [batch]")
    for t in (offsets, sizes, tokens, parents):
        check(t.dtype == torch.int64 and t.is_contiguous() and t.device == logits.device,
              "index tensors must be contiguous int64 on the logits' device")
    if use_triton(logits, force_triton):
        from codespec.kernels import _triton

        return _triton.tree_accept(logits, offsets, sizes, tokens, parents)
    return tree_accept_ref(logits, offsets, sizes, tokens, parents)


def tree_accept_ref(logits: torch.Tensor, offsets: torch.Tensor, sizes: torch.Tensor, tokens: torch.Tensor,
                    parents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    batch, max_nodes = tokens.shape
    choices: dict[int, int] = {}

    def choice(row: int) -> int:
        # Only the rows on the accepted path: a row's argmax over a 150k vocabulary costs
        # ~0.1 ms here, and a pass may carry 64 rows of which a few are read.
        # max().indices is torch.argmax's first-maximum rule at a third of its CPU cost.
        if row not in choices:
            choices[row] = int(logits[row].max(dim=-1).indices)
        return choices[row]

    accepted = torch.zeros(batch, dtype=torch.int64)
    path = torch.full((batch, max(max_nodes - 1, 1)), -1, dtype=torch.int64)
    bonus = torch.zeros(batch, dtype=torch.int64)
    all_tokens, all_parents = tokens.tolist(), parents.tolist()
    for b, (offset, size) in enumerate(zip(offsets.tolist(), sizes.tolist())):
        node_tokens, node_parents = all_tokens[b], all_parents[b]
        last, steps = 0, []
        for i in range(1, size):
            if node_parents[i] == last and node_tokens[i] == choice(offset + last):
                last = i
                steps.append(i)
        accepted[b] = len(steps)
        path[b, : len(steps)] = torch.tensor(steps, dtype=torch.int64)
        bonus[b] = choice(offset + last)
    device = logits.device
    return accepted.to(device), path[:, : max_nodes - 1].to(device), bonus.to(device)
