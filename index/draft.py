"""The value every index returns: a draft, a small token tree in flat form.

Vocabulary (used across codespec): the *context* is the committed token sequence; a
*draft* proposes tokens that may follow it; a *verify pass* checks a draft in one
forward; draft tokens equal to the model's own choices are *accepted*, the model's
token after the last accepted one is the *bonus*; accepted + bonus are *committed*.

A chain is the tree whose node i has parent i - 1:

>>> d = Draft.chain([7, 8, 9], counts=[3, 2, 2], match_len=4, source="context")
>>> d.parents
(-1, 0, 1)
>>> len(d), d.is_chain
(3, True)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class Draft:
    """Proposed continuation of a context, as a tree in topological order.

    token_ids[i] is node i's token; parents[i] is the index of its parent node, or -1
    when it directly follows the context; counts[i] is how many occurrences in the
    source support node i (its estimated probability is counts[i] / counts[parent]).
    match_len is the length of the context suffix that was matched, source names the
    index that produced the draft.
    """

    token_ids: tuple[int, ...]
    parents: tuple[int, ...]
    counts: tuple[int, ...]
    match_len: int
    source: str

    def __post_init__(self) -> None:
        # Cheap checks only: drafts are built on the per-token path (a full parent check
        # would cost more than the index query). `is_valid_tree` is the full check.
        n = len(self.token_ids)
        assert len(self.parents) == n and len(self.counts) == n, "draft arrays differ in length"

    @property
    def is_valid_tree(self) -> bool:
        """Every parent precedes its child (a topological order)."""
        return all(-1 <= p < i for i, p in enumerate(self.parents))

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def is_chain(self) -> bool:
        return all(p == i - 1 for i, p in enumerate(self.parents))

    @classmethod
    def chain(cls, token_ids: Sequence[int], counts: Sequence[int], match_len: int, source: str) -> Draft:
        ids = tuple(int(t) for t in token_ids)
        return cls(ids, tuple(range(-1, len(ids) - 1)), tuple(int(c) for c in counts), match_len, source)

    @classmethod
    def empty(cls, source: str = "none") -> Draft:
        return cls((), (), (), 0, source)

    def truncated(self, max_tokens: int) -> Draft:
        """The first `max_tokens` nodes (a prefix of a topological order is still a tree)."""
        if len(self) <= max_tokens:
            return self
        n = max(0, max_tokens)
        return Draft(self.token_ids[:n], self.parents[:n], self.counts[:n], self.match_len, self.source)

    def with_roots(self, other: Draft) -> Draft:
        """This draft's nodes, then `other`'s as further subtrees of the context (this
        draft's match length and source are kept).

        >>> a = Draft.chain([1, 2], [3, 3], match_len=2, source="index")
        >>> a.with_roots(Draft.chain([7, 8], [1, 1], match_len=1, source="anchor-guess")).parents
        (-1, 0, -1, 2)
        """
        shift = len(self)
        parents = tuple(p + shift if p >= 0 else -1 for p in other.parents)
        return Draft(self.token_ids + other.token_ids, self.parents + parents, self.counts + other.counts,
                     self.match_len, self.source)

    def restricted(self, keep: set[int]) -> Draft:
        """The nodes in `keep` (a set closed under parents), in order.

        >>> Draft((5, 6, 7), (-1, 0, 0), (3, 2, 1), match_len=2, source="index").restricted({0, 2}).parents
        (-1, 0)
        """
        if len(keep) == len(self):
            return self
        kept = sorted(keep)
        new_index = {old: new for new, old in enumerate(kept)}
        return Draft(tuple(self.token_ids[i] for i in kept),
                     tuple(new_index[self.parents[i]] if self.parents[i] >= 0 else -1 for i in kept),
                     tuple(self.counts[i] for i in kept), self.match_len, self.source)

    def within_tail(self, limit: int) -> Draft:
        """The nodes whose path leaves the main chain (the first root, then each node's
        first child: the rows a verify pass holds contiguously, verify/tree.py) for at
        most `limit` nodes: a backend whose rows list their off-chain ancestors in a
        fixed-width table (forward/cuda/forward.py) holds no longer paths. The main chain and
        every short branch stay; a deeper branch is cut where it gets too long.

        >>> d = Draft((1, 2, 3, 4, 5), (-1, 0, -1, 2, 3), (2, 2, 1, 1, 1), match_len=2, source="index")
        >>> d.within_tail(2).token_ids   # 3 -> 4 -> 5 leaves the chain 1 -> 2 for three nodes
        (1, 2, 3, 4)
        """
        first_child: dict[int, int] = {}
        for node, parent in enumerate(self.parents):
            first_child.setdefault(parent, node)
        main, node = set(), first_child.get(-1)
        while node is not None:
            main.add(node)
            node = first_child.get(node)
        tails: list[int] = []
        for node, parent in enumerate(self.parents):
            tails.append(0 if node in main else (tails[parent] if parent >= 0 else 0) + 1)
        return self.restricted({node for node, tail in enumerate(tails) if tail <= limit})
