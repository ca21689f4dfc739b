"""The static index: a repository snapshot as one suffix-array segment plus a file table.

Files edited or deleted since the snapshot are masked (`mask_file`) until the next
rebuild, so drafts never propose text that no longer exists.

>>> idx = StaticIndex.build({"a.py": [1, 2, 3, 4], "b.py": [2, 3, 9]})
>>> length, ends = idx.segment.match([2, 3], 8)
>>> int(length), sorted(idx.segment.corpus[ends + 1].tolist())
(2, [4, 9])
>>> idx.mask_file("a.py")
True
>>> sorted(idx.segment.corpus[idx.segment.match([2, 3], 8)[1] + 1].tolist())
[9]
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from codespec.index import store
from codespec.index.segment import Segment, concat_documents, suffix_array
from codespec.index.store import FileEntry, StoredIndex


class StaticIndex:
    def __init__(self, stored: StoredIndex) -> None:
        self.stored = stored
        starts = np.fromiter((f.start for f in stored.files), dtype=np.int64, count=len(stored.files))
        self.segment = Segment(stored.corpus, starts, np.arange(len(stored.files), dtype=np.int64), stored.sa)
        self._file_index = {f.path: i for i, f in enumerate(stored.files)}

    @classmethod
    def build(
        cls,
        files: Mapping[str, Sequence[int] | np.ndarray],
        *,
        tokenizer: str = "",
        root: str = "",
        file_facts: Mapping[str, tuple[str, int, int]] | None = None,
        meta: dict[str, Any] | None = None,
    ) -> StaticIndex:
        """Index `files` (path -> token ids); `file_facts` gives (sha256, size, mtime_ns)."""
        paths = list(files)
        corpus, starts = concat_documents([files[p] for p in paths])
        facts = file_facts or {}
        entries = [
            FileEntry(p, int(s), int(s) + len(files[p]), *facts.get(p, ("", 0, 0))) for p, s in zip(paths, starts)
        ]
        return cls(StoredIndex(tokenizer, root, entries, corpus, suffix_array(corpus), meta or {}))

    @classmethod
    def load(cls, path: Path, *, tokenizer: str | None = None, verify: bool = True) -> StaticIndex:
        return cls(store.load(path, tokenizer=tokenizer, verify=verify))

    def save(self, path: Path) -> int:
        return store.save(path, self.stored)

    @property
    def files(self) -> list[FileEntry]:
        return self.stored.files

    @property
    def tokenizer(self) -> str:
        return self.stored.tokenizer

    def file_tokens(self, path: str) -> np.ndarray | None:
        i = self._file_index.get(path)
        if i is None:
            return None
        entry = self.stored.files[i]
        return self.stored.corpus[entry.start : entry.end]

    def mask_file(self, path: str) -> bool:
        """Hide an edited or deleted file until the next rebuild; True if indexed."""
        i = self._file_index.get(path)
        return i is not None and self.segment.kill(i)

    def masked_files(self) -> list[str]:
        return [self.stored.files[i].path for i in np.flatnonzero(self.segment.doc_dead)]

    def tokens(self) -> int:
        """Token positions stored, separators included."""
        return self.segment.tokens

    def nbytes(self) -> int:
        return self.segment.nbytes()
