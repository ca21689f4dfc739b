"""SuffixIndex: one query over the static repository index and the dynamic index.

`draft(context_ids, max_tokens)` finds the longest suffix of the context (up to
`max_match` tokens) in any source, pools the occurrences of that length from every
source, and returns the most frequent continuations as a `Draft`: k tokens deep for a
k-token match (capped by `max_tokens`), cut where a node's share of the occurrences
falls under `min_prob`. `tree=False` gives the most frequent path (a chain).

>>> idx = SuffixIndex.build({"a.py": [1, 2, 3, 4, 5], "b.py": [9, 2, 3, 4, 6]})
>>> d = idx.draft([8, 2, 3], max_tokens=8)
>>> d.match_len, d.token_ids, d.counts, d.source
(2, (4, 5), (2, 1), 'static')
>>> idx.add_document("gen:1", [7, 2, 3, 4, 6])
>>> idx.draft([7, 2, 3], max_tokens=8).token_ids     # 3-token match, only in gen:1
(4, 6)
>>> idx.draft([8, 2, 3], max_tokens=8, tree=True).token_ids   # 4 -> {6 (twice), 5}
(4, 6, 5)
"""

from __future__ import annotations

import math
import threading
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np

from codespec.index import search
from codespec.index.draft import Draft
from codespec.index.dynamic import DynamicIndex
from codespec.index.segment import Segment, as_tokens
from codespec.index.static import StaticIndex
from codespec.index.store import IndexFileError

MAX_MATCH = 64
MIN_PROB = 0.1
FILE_KEY = "file:"
_NO_CORPUS = np.empty(0, dtype=np.int32)
_NO_ENDS = np.empty(0, dtype=np.int64)  # dynamic documents that shadow a masked repository file


class SuffixIndex:
    def __init__(self, static: StaticIndex | None = None, dynamic: DynamicIndex | None = None) -> None:
        self.static = static
        self.dynamic = dynamic if dynamic is not None else DynamicIndex()
        self._rebuild: threading.Thread | None = None
        self.rebuild_error: BaseException | None = None

    # -- construction -------------------------------------------------------------------
    @classmethod
    def build(cls, files: Mapping[str, Sequence[int] | np.ndarray], *, tokenizer: str = "", **kwargs) -> SuffixIndex:
        """A static index over `files` (path -> token ids) and an empty dynamic index."""
        return cls(StaticIndex.build(files, tokenizer=tokenizer, **kwargs))

    @classmethod
    def load(cls, path: str | Path, *, tokenizer: str | None = None) -> SuffixIndex:
        """Load a static index file; `tokenizer` (fingerprint), when given, must match."""
        return cls(StaticIndex.load(Path(path), tokenizer=tokenizer))

    def check_tokenizer(self, fingerprint: str) -> None:
        """Refuse a static index built with another tokenizer (its token ids differ)."""
        if self.static is not None and self.static.tokenizer != fingerprint:
            raise IndexFileError(
                f"the index was built with another tokenizer ({self.static.tokenizer[:12]}, the model's is "
                f"{fingerprint[:12]}); rebuild it with the same --model"
            )

    def save(self, path: str | Path) -> int:
        if self.static is None:
            raise ValueError("no static index to save")
        return self.static.save(Path(path))

    # -- queries ------------------------------------------------------------------------
    def draft(
        self,
        context_ids: Sequence[int] | np.ndarray,
        max_tokens: int = 32,
        *,
        tree: bool = False,
        min_prob: float = MIN_PROB,
        max_match: int = MAX_MATCH,
        max_depth: int | None = None,
    ) -> Draft:
        context = as_tokens(context_ids[-max_match:] if max_match else context_ids[:0])
        best, hits = 0, []
        for source, segment in self._sources():
            length, ends = segment.match(context, max_match)
            if length == 0 or ends.shape[0] == 0 or length < best:
                continue
            if length > best:
                best, hits = length, []
            hits.append((source, segment, ends))
        # k tokens for a k-token match, unless the caller prices deeper nodes itself
        depth = min(max_tokens, best if max_depth is None else max_depth)
        if best == 0 or depth <= 0:
            return Draft.empty("index")
        rows = sum(int(ends.shape[0]) for _, _, ends in hits)
        if len(hits) == 1:  # the common case: one segment, its windows read lazily
            _, segment, ends = hits[0]
            windows = np.full((rows, depth), search.UNREAD, dtype=np.int32)
            corpus, n = segment.corpus, segment.tokens
        else:  # equal-length matches in several segments: pool their windows
            windows = np.empty((rows, depth), dtype=np.int32)
            row = 0
            for _, segment, seg_ends in hits:
                row = search.fill_windows(segment.corpus, segment.tokens, seg_ends, depth, windows, row)
            corpus, n, ends = _NO_CORPUS, 0, _NO_ENDS
        min_count = max(1, math.ceil(min_prob * rows))
        tokens, parents, counts = search.build_draft(
            windows, rows, depth, max_tokens, min_count, not tree, corpus, n, ends
        )
        source = "+".join(sorted({s for s, _, _ in hits}))
        return Draft(tuple(tokens.tolist()), tuple(parents.tolist()), tuple(counts.tolist()), best, source)

    def _sources(self) -> list[tuple[str, Segment]]:
        static = self.static  # read once: a background rebuild may swap it meanwhile
        out = [("static", static.segment)] if static is not None else []
        return out + [("dynamic", seg) for seg in self.dynamic.segments()]

    # -- the dynamic side ----------------------------------------------------------------
    def add_document(self, key: str, token_ids: Sequence[int] | np.ndarray) -> None:
        """Add or replace a dynamic document (a past generation, an open buffer)."""
        self.dynamic.add(key, token_ids)

    def remove_document(self, key: str) -> bool:
        return self.dynamic.remove(key)

    def update_file(self, path: str, token_ids: Sequence[int] | np.ndarray) -> None:
        """A repository file changed: mask its stale static copy, index the new text."""
        if self.static is not None:
            self.static.mask_file(path)
        self.dynamic.add(FILE_KEY + path, token_ids)

    def remove_file(self, path: str) -> None:
        if self.static is not None:
            self.static.mask_file(path)
        self.dynamic.remove(FILE_KEY + path)

    # -- background rebuilds -------------------------------------------------------------
    def rebuild_in_background(self, build: Callable[[], StaticIndex]) -> threading.Thread:
        """Run `build` in a thread and swap the new static index in when it is done;
        queries keep using the old one meanwhile. Edited files the new snapshot covers
        leave the dynamic index. A failure is kept in `rebuild_error`."""
        if self._rebuild is not None and self._rebuild.is_alive():
            raise RuntimeError("a rebuild is already running")

        def run() -> None:
            try:
                fresh = build()
            except BaseException as exc:  # reported through rebuild_error, never raised in a thread
                self.rebuild_error = exc
                return
            self.rebuild_error = None
            self.static = fresh
            covered = {f.path for f in fresh.files}
            for key in self.dynamic.keys():
                if key.startswith(FILE_KEY) and key[len(FILE_KEY) :] in covered:
                    self.dynamic.remove(key)

        self._rebuild = threading.Thread(target=run, name="codespec-index-rebuild", daemon=True)
        self._rebuild.start()
        return self._rebuild

    def wait_for_rebuild(self, timeout: float | None = None) -> None:
        if self._rebuild is not None:
            self._rebuild.join(timeout)

    # -- facts --------------------------------------------------------------------------
    def stats(self) -> dict[str, object]:
        static = self.static
        out: dict[str, object] = {"dynamic": self.dynamic.stats()}
        if static is not None:
            tokens = static.tokens() - len(static.files)  # without separators
            out["static"] = {
                "files": len(static.files),
                "tokens": tokens,
                "bytes": static.nbytes(),
                "bytes_per_token": round(static.nbytes() / max(tokens, 1), 2),
                "masked_files": len(static.masked_files()),
                "tokenizer": static.tokenizer,
            }
        return out
