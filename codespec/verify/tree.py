"""A request's rows in one verify pass: its pending token and its draft tree.

Node 0 is the pending token (committed, KV not yet computed); nodes 1.. are the draft's
nodes, reordered depth first with each node's children in the draft's order (most
frequent first). Depth-first order keeps the main path's nodes consecutive: node i's
ancestors are exactly nodes 0..i-1 whenever depth(i) == i, which lets attention read
them as one slice of the KV slot instead of gathering them (see attention.py).

>>> from codespec.index import Draft
>>> d = Draft((5, 6, 7), (-1, -1, 0), (3, 1, 2), match_len=4, source="index")
>>> t = VerifyTree.build(9, d)           # draft: 5 and 6 follow the context, 7 follows 5
>>> t.tokens, t.parents, t.depths
((9, 5, 7, 6), (-1, 0, 1, 0), (0, 1, 2, 1))
>>> t.path(2), t.draft_nodes
([0, 1, 2], (0, 2, 1))
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from codespec.index import Draft


@dataclass(frozen=True)
class VerifyTree:
    tokens: tuple[int, ...]  # [nodes]; tokens[0] is the pending token
    parents: tuple[int, ...]  # [nodes]; parents[0] == -1, parents[i] < i
    depths: tuple[int, ...]  # [nodes]; depth 0 is the pending token
    draft_nodes: tuple[int, ...]  # node i >= 1 is the draft's node draft_nodes[i - 1]
    counts: tuple[int, ...] = ()  # [nodes]; the draft's support per node (node 0: 0)

    @classmethod
    def build(cls, pending: int, draft: Draft) -> VerifyTree:
        children: list[list[int]] = [[] for _ in range(len(draft) + 1)]  # by draft node + 1
        for node, parent in enumerate(draft.parents):
            children[parent + 1].append(node + 1)
        order: list[int] = []  # draft nodes (+1) in depth-first preorder
        stack = list(reversed(children[0]))
        while stack:
            node = stack.pop()
            order.append(node)
            stack.extend(reversed(children[node]))
        position = {0: 0, **{node: i + 1 for i, node in enumerate(order)}}
        tokens, parents, depths, counts = [pending], [-1], [0], [0]
        for node in order:
            parent = position[draft.parents[node - 1] + 1]
            tokens.append(draft.token_ids[node - 1])
            parents.append(parent)
            depths.append(depths[parent] + 1)
            counts.append(draft.counts[node - 1])
        return cls(tuple(tokens), tuple(parents), tuple(depths), tuple(n - 1 for n in order), tuple(counts))

    @classmethod
    def chain(cls, pending: int, draft_ids: tuple[int, ...] | list[int] = ()) -> VerifyTree:
        n = len(draft_ids) + 1
        return cls((pending, *draft_ids), tuple(range(-1, n - 1)), tuple(range(n)), tuple(range(n - 1)))

    def __len__(self) -> int:
        return len(self.tokens)

    def path(self, node: int) -> list[int]:
        """Nodes from the pending token down to `node`, inclusive."""
        out = []
        while node >= 0:
            out.append(node)
            node = self.parents[node]
        return out[::-1]

    def children(self, node: int) -> list[int]:
        return [i for i in range(node + 1, len(self)) if self.parents[i] == node]

    def chains(self) -> list[tuple[int, int]]:
        """The rows as chains [start, end): runs in which each node is its predecessor's
        child. Depth-first order makes every chain consecutive; the first is the main
        path, each other one starts at a node that is not its parent's first child.

        >>> VerifyTree((9, 1, 2, 3, 4, 5), (-1, 0, 1, 0, 3, 1), (0, 1, 2, 1, 2, 2), ()).chains()
        [(0, 3), (3, 5), (5, 6)]
        """
        found, begin = [], 0
        for node in range(1, len(self)):
            if self.parents[node] != node - 1:
                found.append((begin, node))
                begin = node
        found.append((begin, len(self)))
        return found


@dataclass(frozen=True)
class VerifyResult:
    """What a verify pass decided for one request's tree."""

    accepted: int  # draft tokens accepted
    committed: tuple[int, ...]  # accepted draft tokens + the bonus token
    path: tuple[int, ...] = ()  # the accepted nodes of the tree, in order (node 0 excluded)
    logprobs: tuple[Any, ...] | None = field(default=None, repr=False)  # per committed token, when asked


def accept_choices(choices: Sequence[int], tree: VerifyTree) -> VerifyResult:
    """Greedy acceptance given the model's choice after each node (`choices[i]`: the argmax
    of row i, the first maximum): scanning nodes in order, a node is accepted when its
    parent is the last accepted node and its token is the choice there; the bonus is the
    choice after the path (kernels/accept.py's rule).

    >>> accept_choices([2, 4, 0], VerifyTree.chain(9, [2, 3]))   # 2 matches, 3 != 4: bonus 4
    VerifyResult(accepted=1, committed=(2, 4), path=(1,))
    """
    last, chosen, path = 0, int(choices[0]), []
    for node in range(1, len(tree)):
        if tree.parents[node] == last and tree.tokens[node] == chosen:
            path.append(node)
            last, chosen = node, int(choices[node])
    return VerifyResult(len(path), tuple(tree.tokens[i] for i in path) + (chosen,), tuple(path))


# How a request's rows (logits [nodes, vocab]) turn into committed tokens: None for
# greedy (batched), or a speculative-sampling rule bound to the request's parameters
# (codespec.verify.sampling).
Accept = Callable[[Any, VerifyTree], VerifyResult]


@dataclass(frozen=True)
class Item:
    """One request's part of a verify pass."""

    slot: int
    tree: VerifyTree
    accept: Accept | None = None  # None: greedy
