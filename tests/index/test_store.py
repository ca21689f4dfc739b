"""Index files: round trip, atomic writes, and a clear error for every bad file."""

from __future__ import annotations

import os

import pytest

from codespec.index import IndexFileError, SuffixIndex


@pytest.fixture
def saved(tmp_path):
    idx = SuffixIndex.build({"a.py": [1, 2, 3, 4], "b.py": [5, 2, 3, 6]}, tokenizer="tok-A", root="/repo")
    path = tmp_path / "repo.csidx"
    size = idx.save(path)
    assert size == path.stat().st_size
    return path


def test_round_trip(saved):
    idx = SuffixIndex.load(saved, tokenizer="tok-A")
    corpus = idx.static.segment.corpus
    assert not corpus.flags.owndata and not corpus.flags.writeable  # mapped, not read
    assert [f.path for f in idx.static.files] == ["a.py", "b.py"]
    assert idx.draft([2, 3], 4, tree=True).token_ids == (4, 6)
    assert idx.static.stored.root == "/repo"


def test_tokenizer_mismatch_is_refused(saved):
    with pytest.raises(IndexFileError, match="another tokenizer"):
        SuffixIndex.load(saved, tokenizer="tok-B")


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda b: b[: len(b) - 3], "truncated"),
        (lambda b: b + b"\0" * 8, "truncated or padded"),
        (lambda b: b"NOTINDEX" + b[8:], "not a codespec index"),
        (lambda b: b[:8] + (99).to_bytes(4, "little") + b[12:], "format version 99"),
        (lambda b: b[:16] + b"{{{{" + b[20:], "corrupt header"),
        (lambda b: b[:-5] + bytes([b[-5] ^ 0xFF]) + b[-4:], "checksum mismatch"),
        (lambda b: b"", "not a codespec index"),
    ],
)
def test_damaged_files_give_a_clear_error(saved, damage, message):
    saved.write_bytes(damage(saved.read_bytes()))
    with pytest.raises(IndexFileError, match=message):
        SuffixIndex.load(saved)


def test_missing_file(tmp_path):
    with pytest.raises(IndexFileError, match="no such file"):
        SuffixIndex.load(tmp_path / "nope.csidx")


def test_failed_write_keeps_the_old_file(saved, monkeypatch):
    before = saved.read_bytes()
    idx = SuffixIndex.build({"c.py": [7, 7, 7]})

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(OSError):
        idx.save(saved)
    assert saved.read_bytes() == before
    assert [p.name for p in saved.parent.iterdir()] == [saved.name]  # no temporary left
