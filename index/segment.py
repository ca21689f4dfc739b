"""A segment: documents stored as one SEP-separated int32 corpus, searchable.

Two kinds share one interface, `match(context, max_match) -> (length, ends)`:
* sorted: a suffix array of the reversed corpus (pydivsufsort), for anything large;
* scanned: no suffix array, brute-force matched; for the small, growing tail of the
  dynamic index, where appends must cost nothing.

Documents can be masked (`kill`): their occurrences are skipped until the segment is
rebuilt without them.

>>> seg = Segment.build([[1, 2, 3, 4], [9, 2, 3, 5]], doc_ids=[10, 11])
>>> length, ends = seg.match([7, 2, 3], max_match=8)
>>> int(length), sorted(seg.corpus[ends + 1].tolist())
(2, [4, 5])
>>> seg.kill(11)
True
>>> sorted(seg.corpus[seg.match([7, 2, 3], 8)[1] + 1].tolist())
[4]
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from codespec.index import search

MAX_OCCURRENCES = 128  # continuation windows read per query and segment (sampled evenly)


class Segment:
    def __init__(
        self,
        corpus: np.ndarray,  # [n] int32, each document followed by SEP
        doc_starts: np.ndarray,  # [docs] int64, ascending, first 0
        doc_ids: np.ndarray,  # [docs] int64, caller's document ids
        sa: np.ndarray | None,  # [n] int32 suffix array of corpus[::-1], or None (scanned)
    ) -> None:
        assert corpus.dtype == np.int32 and doc_starts.dtype == np.int64
        self.corpus = corpus
        self.doc_starts = doc_starts
        self.doc_ids = doc_ids
        self.sa = sa
        self.tokens = int(corpus.shape[0])  # stored positions, separators included
        self.rev = corpus[::-1]  # what the suffix array sorts (a view, no copy)
        self.doc_dead = np.zeros(len(doc_starts), dtype=np.bool_)
        self.any_dead = False
        self._index_of = {int(d): i for i, d in enumerate(doc_ids)}

    @classmethod
    def build(cls, docs: Sequence[Sequence[int] | np.ndarray], doc_ids: Sequence[int], sort: bool = True) -> Segment:
        corpus, starts = concat_documents(docs)
        sa = suffix_array(corpus) if sort else None
        return cls(corpus, starts, np.asarray(doc_ids, dtype=np.int64), sa)

    # -- facts ------------------------------------------------------------------------
    def doc_range(self, i: int) -> tuple[int, int]:
        """Corpus range [start, end) of local document i, without its separator."""
        end = int(self.doc_starts[i + 1]) - 1 if i + 1 < len(self.doc_starts) else self.tokens - 1
        return int(self.doc_starts[i]), end

    def live_docs(self) -> list[tuple[int, np.ndarray]]:
        """(doc_id, tokens) of every live document, in storage order."""
        out = []
        for i, doc_id in enumerate(self.doc_ids):
            if not self.doc_dead[i]:
                start, end = self.doc_range(i)
                out.append((int(doc_id), self.corpus[start:end]))
        return out

    def live_tokens(self) -> int:
        return sum(e - s for i in range(len(self.doc_ids)) if not self.doc_dead[i] for s, e in [self.doc_range(i)])

    def kill(self, doc_id: int) -> bool:
        """Mask a document; True if this segment holds it."""
        i = self._index_of.get(int(doc_id))
        if i is None:
            return False
        self.doc_dead[i] = True
        self.any_dead = True
        return True

    def nbytes(self) -> int:
        total = self.corpus.nbytes + self.doc_starts.nbytes + self.doc_ids.nbytes + self.doc_dead.nbytes
        return total + (self.sa.nbytes if self.sa is not None else 0)

    # -- queries ----------------------------------------------------------------------
    def match(self, context: Sequence[int] | np.ndarray, max_match: int) -> tuple[int, np.ndarray]:
        """Longest suffix of `context` in a live document, and the ends of its
        occurrences (at most MAX_OCCURRENCES, evenly sampled)."""
        context = as_tokens(context)
        if self.tokens == 0 or len(self.doc_starts) == 0:
            return 0, np.empty(0, dtype=np.int64)
        if self.sa is None:
            length, ends = search.scan_longest_match(
                self.corpus, self.tokens, context, int(max_match), self.doc_starts, self.doc_dead, -1
            )
            if ends.shape[0] > MAX_OCCURRENCES:
                step = -(-ends.shape[0] // MAX_OCCURRENCES)
                # a copy, not a strided view: numba types a non-contiguous array apart, and
                # build_draft compiled inside a request for it (3.5 s in a typing replay)
                ends = np.ascontiguousarray(ends[::step])
            return length, ends
        any_dead = self.any_dead
        lo, hi, length = search.sa_longest_match(
            self.rev, self.sa, context, int(max_match), self.doc_starts, self.doc_dead, any_dead
        )
        if length == 0:
            return 0, np.empty(0, dtype=np.int64)
        ends = search.sa_ends(self.sa, lo, hi, self.tokens, MAX_OCCURRENCES, self.doc_starts, self.doc_dead, any_dead)
        return length, ends


def as_tokens(tokens: Sequence[int] | np.ndarray) -> np.ndarray:
    """A contiguous int32 array (what the kernels are compiled for)."""
    return np.ascontiguousarray(tokens, dtype=np.int32)


def concat_documents(docs: Sequence[Sequence[int] | np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """One int32 corpus with SEP after each document, and each document's start."""
    lengths = np.fromiter((len(d) for d in docs), dtype=np.int64, count=len(docs))
    starts = np.zeros(len(docs), dtype=np.int64)
    if len(docs):
        starts[1:] = np.cumsum(lengths + 1)[:-1]
    corpus = np.full(int(lengths.sum() + len(docs)), search.SEP, dtype=np.int32)
    for start, doc in zip(starts, docs):
        arr = np.asarray(doc, dtype=np.int64)
        if arr.size and (arr.min() < 0 or arr.max() >= search.SEP):
            raise ValueError("token ids must be in [0, 2**31 - 1)")
        corpus[start : start + arr.size] = arr
    return corpus, starts


def suffix_array(corpus: np.ndarray) -> np.ndarray:
    """Suffix array of the reversed corpus (int32)."""
    from pydivsufsort import divsufsort

    if corpus.shape[0] == 0:
        return np.empty(0, dtype=np.int32)
    return np.asarray(divsufsort(np.ascontiguousarray(corpus[::-1])), dtype=np.int32)
