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


def _with_header(path, change) -> None:
    """Rewrite the file with its JSON header changed (the data kept, re-aligned)."""
    import json

    from codespec.index import store

    raw = path.read_bytes()
    magic, version, length = store._PREAMBLE.unpack(raw[: store._PREAMBLE.size])
    header = json.loads(raw[store._PREAMBLE.size : store._PREAMBLE.size + length])
    data = raw[store._aligned(store._PREAMBLE.size + length):]
    blob = json.dumps(change(header)).encode()
    start = store._aligned(store._PREAMBLE.size + len(blob))
    path.write_bytes(store._PREAMBLE.pack(magic, version, len(blob)) + blob
                     + b"\0" * (start - store._PREAMBLE.size - len(blob)) + data)


@pytest.mark.parametrize("change", [
    lambda h: {k: v for k, v in h.items() if k != "crc32"},
    lambda h: {**h, "crc32": "not an object"},
    lambda h: {**h, "crc32": {"corpus": 1}},
    lambda h: {**h, "crc32": ["corpus", "sa"]},
    lambda h: {**h, "tokenizer": None},
    lambda h: {k: v for k, v in h.items() if k != "tokenizer"},
    lambda h: {**h, "meta": [1, 2]},
    lambda h: {**h, "files": [{"nonsense": 1}]},
    lambda h: {**h, "tokens": "many"},
    lambda h: [h],
])
def test_a_header_with_missing_or_wrong_fields_is_one_clear_error(saved, change):
    _with_header(saved, change)
    with pytest.raises(IndexFileError, match="corrupt header"):
        SuffixIndex.load(saved, tokenizer="tok-A")
