"""Longest suffix match of a growing token sequence within itself (prompt lookup).

A request's own prompt and output are its first and often best draft source: an edit
copies most of the code it was given. The matcher keeps the sequence in a growable
int32 buffer and, per query, scans it once for the earlier occurrences of its last token
and how far back each agrees, then follows the most frequent continuation (numba kernels
in index/search.py: microseconds on a few thousand tokens; the vectorised numpy they
replaced took ~0.1 ms a draft, which at batch 8 was half of a step's host work).

Worked example: context [5, 1, 2, 3, 4, 1, 2]. The suffix [1, 2] also ends at index 2,
and [5, 1, 2] does not occur again, so the longest match is 2 tokens, and what followed
it was 3, 4, 1, 2:

>>> m = ContextMatcher([5, 1, 2, 3, 4, 1, 2])
>>> m.longest_match()[0]
2
>>> m.draft(max_tokens=3).token_ids
(3, 4, 1)
"""

from __future__ import annotations

import math
from typing import Iterable

import numpy as np

from codespec.index import search
from codespec.index.draft import Draft

SOURCE = "context"
_INITIAL_CAPACITY = 1024


class ContextMatcher:
    """Finds the longest suffix of a token sequence that occurred earlier in it."""

    def __init__(self, tokens: Iterable[int] = (), max_match: int = 64) -> None:
        if max_match < 1:
            raise ValueError(f"max_match must be at least 1, got {max_match}")
        self.max_match = max_match
        self._buf = np.empty(_INITIAL_CAPACITY, dtype=np.int32)
        self._n = 0
        self.last_match: tuple[int, np.ndarray] = (0, np.empty(0, dtype=np.int64))  # of the last draft()
        self.extend(tokens)

    def __len__(self) -> int:
        return self._n

    @property
    def tokens(self) -> np.ndarray:
        """The sequence so far (a read-only view)."""
        view = self._buf[: self._n]
        view.flags.writeable = False
        return view

    def extend(self, tokens: Iterable[int]) -> None:
        new = np.fromiter(tokens, dtype=np.int64)
        if new.size and (new.min() < 0 or new.max() > np.iinfo(np.int32).max):
            raise ValueError("token ids must be non-negative int32 values")
        need = self._n + new.size
        if need > self._buf.size:
            grown = np.empty(max(need, 2 * self._buf.size), dtype=np.int32)
            grown[: self._n] = self._buf[: self._n]
            self._buf = grown
        self._buf[self._n : need] = new
        self._n = need

    def truncate(self, n: int) -> None:
        """Forget every token past the first `n` (a caller that extended to look ahead)."""
        if not 0 <= n <= self._n:
            raise ValueError(f"cannot truncate {self._n} tokens to {n}")
        self._n = n

    def longest_match(self) -> tuple[int, np.ndarray]:
        """Return `(match_len, ends)`: the longest suffix (up to `max_match` tokens) that
        also ends earlier, and every earlier index where it ends (ascending)."""
        return search.self_longest_match(self._buf, self._n, self.max_match)

    def draft(self, max_tokens: int, *, tree: bool = False, min_prob: float = 0.1,
              max_depth: int | None = None) -> Draft:
        """The most frequent continuation of the longest match, as a chain of up to
        `max_tokens` tokens (ties go to the most recent occurrence); or, with `tree`, a
        tree of up to `max_tokens` nodes no deeper than `max_depth` (default: the match's
        length, k tokens for a k-token match), best first by count, without branches
        followed by fewer than `min_prob` of the occurrences.

        >>> m = ContextMatcher([1, 2, 3, 1, 2, 4, 1, 2])   # [1, 2] was followed by 3 1, 4 1
        >>> d = m.draft(4, tree=True); d.token_ids, d.parents
        ((3, 1, 4, 1), (-1, 0, -1, 2))
        """
        length, ends = self.last_match = self.longest_match()
        if length == 0 or max_tokens <= 0:
            return Draft.empty(SOURCE)
        if tree:
            return self._tree(length, ends, max_tokens, min_prob, length if max_depth is None else max_depth)
        token_ids, counts = search.chain_after(self._buf, self._n, ends, max_tokens)
        return Draft.chain(token_ids.tolist(), counts.tolist(), match_len=length, source=SOURCE)

    def _tree(self, length: int, ends: np.ndarray, max_tokens: int, min_prob: float, max_depth: int) -> Draft:
        depth = min(max_tokens, max_depth)
        rows = ends.shape[0]
        windows = np.empty((rows, depth), dtype=np.int32)
        corpus = self._buf[: self._n]
        search.fill_windows(corpus, self._n, ends, depth, windows, 0)
        min_count = max(1, math.ceil(min_prob * rows))
        tokens, parents, counts = search.build_draft(
            windows, rows, depth, max_tokens, min_count, False, corpus, self._n, ends
        )
        return Draft(tuple(tokens.tolist()), tuple(parents.tolist()), tuple(counts.tolist()), length, SOURCE)

