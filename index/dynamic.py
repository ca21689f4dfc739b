"""The dynamic index: past generations, open buffers and edited files, online.

Documents arrive as they happen (`add`, which replaces a document with the same key)
and leave by key (`remove`) or by age: the live tokens stay within a token budget,
oldest documents evicted first (a budget in tokens, not in requests: one agent
transcript can outweigh a thousand completions).

Structure: a log-structured set of segments. New documents land in a small unsorted
*tail* that queries scan by brute force, so an append costs a copy. When the tail
reaches `tail_tokens` it becomes a suffix-array segment; whenever `merge_factor`
segments of one size class exist they are merged into one (dropping dead documents),
so each token is re-sorted about log_8(budget / tail) times and a query visits a
handful of segments.

>>> dyn = DynamicIndex(budget_tokens=100)
>>> dyn.add("gen:1", [5, 6, 7, 8]); dyn.add("buf:a.py", [1, 6, 7, 2])
>>> [sorted(seg.corpus[ends + 1].tolist()) for seg in dyn.segments() for _, ends in [seg.match([6, 7], 8)]]
[[2, 8]]
>>> dyn.add("gen:2", list(range(10, 110)))   # over budget: the oldest two leave
>>> dyn.keys()
['gen:2']
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from typing import Iterator, Sequence

import numpy as np

from codespec.index.segment import Segment, as_tokens

DEFAULT_BUDGET_TOKENS = 2_000_000
DEFAULT_TAIL_TOKENS = 16_384
MERGE_FACTOR = 8


class DynamicIndex:
    def __init__(
        self,
        budget_tokens: int = DEFAULT_BUDGET_TOKENS,
        tail_tokens: int = DEFAULT_TAIL_TOKENS,
        merge_factor: int = MERGE_FACTOR,
    ) -> None:
        if budget_tokens < 1 or tail_tokens < 1 or merge_factor < 2:
            raise ValueError("budget_tokens and tail_tokens must be positive, merge_factor at least 2")
        self.budget_tokens = budget_tokens
        self.tail_tokens = tail_tokens
        self.merge_factor = merge_factor
        self._docs: OrderedDict[str, tuple[int, int]] = OrderedDict()  # key -> (doc id, tokens), oldest first
        self._next_id = 0
        self._live_tokens = 0
        self._sorted: list[Segment] = []
        self._tail_docs: list[tuple[int, np.ndarray]] = []
        self._tail_segment: Segment | None = None
        self._lock = threading.Lock()  # writers only; queries read immutable snapshots

    # -- writes -------------------------------------------------------------------------
    def add(self, key: str, tokens: Sequence[int] | np.ndarray) -> None:
        """Add (or replace) a document, then evict the oldest past the budget. A document
        larger than the whole budget keeps its last `budget_tokens` tokens."""
        arr = as_tokens(tokens)[-self.budget_tokens :].copy()
        with self._lock:
            self._remove_locked(key)
            doc_id = self._next_id
            self._next_id += 1
            self._docs[key] = (doc_id, int(arr.size))
            self._live_tokens += int(arr.size)
            self._tail_docs.append((doc_id, arr))
            self._tail_segment = None
            while self._live_tokens > self.budget_tokens:
                self._remove_locked(next(iter(self._docs)))
            if self._tail_size() >= self.tail_tokens:
                self._flush_tail()

    def remove(self, key: str) -> bool:
        with self._lock:
            return self._remove_locked(key)

    def _remove_locked(self, key: str) -> bool:
        entry = self._docs.pop(key, None)
        if entry is None:
            return False
        doc_id, size = entry
        self._live_tokens -= size
        before = len(self._tail_docs)
        self._tail_docs = [(d, t) for d, t in self._tail_docs if d != doc_id]
        if len(self._tail_docs) != before:
            self._tail_segment = None
            return True
        for seg in self._sorted:
            if seg.kill(doc_id):
                if seg.live_tokens() * 2 < seg.tokens:  # mostly dead: compact it now
                    self._sorted = [s if s is not seg else _compact(seg) for s in self._sorted]
                    self._sorted = [s for s in self._sorted if s.tokens]
                break
        return True

    def _tail_size(self) -> int:
        return sum(t.size + 1 for _, t in self._tail_docs)

    def _flush_tail(self) -> None:
        docs = self._tail_docs
        self._tail_docs, self._tail_segment = [], None
        if docs:
            self._sorted.append(Segment.build([t for _, t in docs], [d for d, _ in docs]))
        self._merge()

    def _level(self, seg: Segment) -> int:
        return int(math.log(max(seg.tokens, 1) / self.tail_tokens, self.merge_factor)) if seg.tokens else 0

    def _merge(self) -> None:
        while len(self._sorted) >= self.merge_factor:
            tail = self._sorted[-self.merge_factor :]
            level = self._level(tail[-1])
            if any(self._level(s) != level for s in tail):
                return
            docs = [doc for seg in tail for doc in seg.live_docs()]
            merged = Segment.build([t for _, t in docs], [d for d, _ in docs])
            self._sorted = self._sorted[: -self.merge_factor] + ([merged] if merged.tokens else [])

    # -- reads --------------------------------------------------------------------------
    def segments(self) -> Iterator[Segment]:
        """Segments to query (a snapshot: later writes do not disturb it)."""
        with self._lock:
            sorted_now = list(self._sorted)
            if self._tail_segment is None and self._tail_docs:
                docs = self._tail_docs
                self._tail_segment = Segment.build([t for _, t in docs], [d for d, _ in docs], sort=False)
            tail = self._tail_segment
        yield from sorted_now
        if tail is not None:
            yield tail

    def keys(self) -> list[str]:
        return list(self._docs)

    def __contains__(self, key: str) -> bool:
        return key in self._docs

    @property
    def live_tokens(self) -> int:
        return self._live_tokens

    def stats(self) -> dict[str, int]:
        segs = list(self.segments())
        return {
            "documents": len(self._docs),
            "live_tokens": self._live_tokens,
            "budget_tokens": self.budget_tokens,
            "segments": len(segs),
            "stored_tokens": sum(s.tokens for s in segs),
            "bytes": sum(s.nbytes() for s in segs),
        }


def _compact(seg: Segment) -> Segment:
    docs = seg.live_docs()
    return Segment.build([t for _, t in docs], [d for d, _ in docs])
