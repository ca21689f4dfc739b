"""Build a repository's static index: walk, tokenize (only what changed), sort, save.

    report = build_repository_index(Path("."), tokenizer, Path("repo.csidx"))
    report.files, report.tokens, report.reused_files

A second run over the same output file re-tokenizes only files whose bytes changed
(tokenizing is most of the cost; the suffix array is rebuilt in seconds).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
from tqdm import tqdm

from codespec.index import IndexFileError, StaticIndex
from codespec.index import store
from codespec.prompts import encode_texts
from codespec.indexing.walk import WalkReport, read_text, walk_repository

_BATCH_FILES = 64
log = logging.getLogger("codespec.index")


@dataclass
class IndexReport:
    path: str
    root: str
    files: int
    tokens: int
    seconds: float
    bytes: int
    reused_files: int
    tokenized_files: int
    skipped: WalkReport = field(default_factory=WalkReport)

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "root": self.root,
            "files": self.files,
            "tokens": self.tokens,
            "seconds": round(self.seconds, 3),
            "bytes": self.bytes,
            "reused_files": self.reused_files,
            "tokenized_files": self.tokenized_files,
            "skipped": vars(self.skipped),
        }


def tokenizer_fingerprint(tokenizer: Any, cache_dir: Path | str | None = None) -> str:
    """sha256 of the vocabulary and added tokens: equal iff token ids mean the same.

    Computing it takes ~0.7 s for a 150k vocabulary (sorting and serialising it), which a
    fresh `codespec generate --index` paid on every run. With `cache_dir`, a tokenizer
    that names the files it was read from (`source_files`: the torch-free tokenizer's) has its
    fingerprint kept in `<cache_dir>/fingerprints/`, keyed by those files' paths, sizes
    and modification times, and read back in a millisecond."""
    files = getattr(tokenizer, "source_files", None)
    if cache_dir is None or not files:
        return _fingerprint(tokenizer)
    stamp = json.dumps([[str(Path(f).resolve()), Path(f).stat().st_size, Path(f).stat().st_mtime_ns] for f in files])
    memo = Path(cache_dir) / "fingerprints" / f"{hashlib.sha256(stamp.encode()).hexdigest()[:32]}.txt"
    try:
        found = memo.read_text().strip()
        if len(found) == 64 and all(c in "0123456789abcdef" for c in found):
            return found
    except OSError:
        pass
    fingerprint = _fingerprint(tokenizer)
    try:
        memo.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=memo.parent, prefix=".fp-", delete=False) as tmp:
            tmp.write(fingerprint)
        os.replace(tmp.name, memo)
    except OSError:
        pass  # a read-only cache only costs the computation next time
    return fingerprint


def _fingerprint(tokenizer: Any) -> str:
    vocab = sorted(tokenizer.get_vocab().items())
    digest = hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode())
    digest.update(getattr(tokenizer, "fingerprint_class", type(tokenizer).__name__).encode())  # direct/tokenizer.py
    return digest.hexdigest()


def build_repository_index(root: Path, tokenizer: Any, out: Path, *, progress: bool = True,
                           on_file: Callable[[int, int], None] | None = None,
                           max_total_bytes: int | None = None) -> IndexReport:
    """Index `root` into `out` (incrementally: unchanged files keep their tokens);
    `progress` draws bars on stderr, `on_file(done, total)` reports each file read
    (the language server turns it into `window/workDoneProgress`). The walk stops once
    its files reach `max_total_bytes`, and the report says so (`IndexReport.capped`)."""
    started = time.perf_counter()
    root = Path(root).resolve()
    if not root.is_dir():
        raise IndexFileError(f"{root}: not a directory; give the repository's folder")
    fingerprint = tokenizer_fingerprint(tokenizer)
    previous = _previous_tokens(out, fingerprint)
    skipped = WalkReport()
    found = list(tqdm(walk_repository(root, report=skipped, max_total_bytes=max_total_bytes), desc="scan",
                      unit=" files", disable=not progress))
    if skipped.over_cap:
        log.warning("%s", capped_message(root, len(found), skipped.taken_bytes, max_total_bytes or 0))

    tokens: dict[str, np.ndarray] = {}
    facts: dict[str, tuple[str, int, int]] = {}
    pending: list[tuple[str, str]] = []
    reused = 0
    with tqdm(total=len(found), desc="tokenize", unit=" files", disable=not progress) as bar:
        for f in found:
            try:
                text, data = read_text(f.absolute)
            except OSError:
                bar.update()
                continue
            sha = hashlib.sha256(data).hexdigest()
            facts[f.path] = (sha, f.size, f.mtime_ns)
            old = previous.get(f.path)
            if on_file is not None:
                on_file(len(facts), len(found))
            if old is not None and old[0] == sha:
                tokens[f.path] = old[1]
                reused += 1
                bar.update()
            else:
                tokens[f.path] = np.empty(0, dtype=np.int32)  # keeps walk order; filled below
                pending.append((f.path, text))
            if len(pending) >= _BATCH_FILES:
                _encode_batch(tokenizer, pending, tokens, bar)
        _encode_batch(tokenizer, pending, tokens, bar)

    if progress:
        print(f"sorting {sum(t.size for t in tokens.values()):,} tokens ...", flush=True, file=sys.stderr)
    index = StaticIndex.build(tokens, tokenizer=fingerprint, root=str(root), file_facts=facts,
                              meta={"codespec_index": 1})
    size = index.save(out)
    return IndexReport(
        path=str(out), root=str(root), files=len(tokens), tokens=int(sum(t.size for t in tokens.values())),
        seconds=time.perf_counter() - started, bytes=size, reused_files=reused,
        tokenized_files=len(tokens) - reused, skipped=skipped,
    )


def capped_message(root: Path, files: int, taken: int, cap: int) -> str:
    return (f"indexing {root}: stopped at the size cap, {files} files ({taken / 2**20:.1f} MiB) taken of a "
            f"{cap / 2**20:.0f} MiB cap; the rest is not indexed. Point --repo at the project's folder, list what "
            f"to leave out in a .codespecignore (or .gitignore, .ignore), or raise --index-max-mb")


def _encode_batch(tokenizer: Any, pending: list[tuple[str, str]], tokens: dict[str, np.ndarray], bar: tqdm) -> None:
    if not pending:
        return
    encoded = encode_texts(tokenizer, [text for _, text in pending])
    for (path, _), ids in zip(pending, encoded):
        tokens[path] = np.asarray(ids, dtype=np.int32)
    bar.update(len(pending))
    pending.clear()


def _previous_tokens(out: Path, fingerprint: str) -> dict[str, tuple[str, np.ndarray]]:
    """path -> (sha256, tokens) from an earlier index at `out` built with this tokenizer."""
    try:
        old = store.load(out, tokenizer=fingerprint)
    except IndexFileError:
        return {}  # none, another tokenizer, or damaged: build from scratch
    return {f.path: (f.sha256, np.array(old.corpus[f.start : f.end])) for f in old.files}


def build_static_index(root: Path, tokenizer: Any, cache_dir: Path, *,
                       on_file: Callable[[int, int], None] | None = None,
                       max_total_bytes: int | None = None) -> tuple[IndexReport, StaticIndex]:
    """Index `root` into its file under `cache_dir` (quietly, incrementally) and load the
    result, checked against `tokenizer`: what a server or language server swaps in as its
    static index."""
    from codespec.index import SuffixIndex

    out = default_index_path(cache_dir, root)
    report = build_repository_index(root, tokenizer, out, progress=False, on_file=on_file,
                                    max_total_bytes=max_total_bytes)
    return report, SuffixIndex.load(out, tokenizer=tokenizer_fingerprint(tokenizer)).static


def default_index_path(cache_dir: Path, root: Path) -> Path:
    """`<cache>/indexes/<folder name>-<hash of its absolute path>.csidx`."""
    root = Path(root).resolve()
    digest = hashlib.sha256(str(root).encode()).hexdigest()[:12]
    return Path(cache_dir) / "indexes" / f"{root.name or 'root'}-{digest}.csidx"
