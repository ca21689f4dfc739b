"""`codespec index export --sglang`: the corpus SGLang reads gives back the index's tokens."""

from __future__ import annotations

import json

import pytest

from codespec.cli.main import main

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def tokenizer():
    from codespec.models.loading import load_tokenizer
    from codespec.settings import Settings

    return load_tokenizer(Settings(), progress=False)


@pytest.fixture
def indexed(tmp_path, tokenizer):
    from codespec.indexing import build_repository_index

    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "a.py").write_text("def add(a, b):\n    return a + b\n\n\nprint(add(1, 2))  # ünïcode\n")
    (repo / "pkg" / "b.py").write_text("class Point:\n    def __init__(self, x, y):\n        self.x, self.y = x, y\n")
    (repo / "fixture.txt").write_text("a test fixture that spells <|endoftext|> in its text\n")
    build_repository_index(repo, tokenizer, tmp_path / "repo.csidx", progress=False)
    return tmp_path / "repo.csidx"


def _sglang_read(path, tokenizer):
    """What SGLang's loader does with each line: a JSON string, tokenized plainly."""
    docs = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    assert all(isinstance(d, str) for d in docs)
    return [tokenizer.encode(d, add_special_tokens=False) for d in docs]


def test_every_file_round_trips_but_the_one_spelling_a_special_token(indexed, tmp_path, tokenizer):
    from codespec.index import SuffixIndex
    from codespec.integrations.sglang import export_corpus

    index = SuffixIndex.load(indexed)
    report = export_corpus(index, tokenizer, tmp_path / "corpus.jsonl", progress=False)
    stored = index.static.stored
    expected = [stored.corpus[f.start:f.end].tolist() for f in stored.files]
    read = _sglang_read(tmp_path / "corpus.jsonl", tokenizer)
    assert report.files == 3 and report.left_out == 0 and report.retokenized == 1
    assert report.tokens == sum(map(len, expected)) + 2  # two separators between three documents
    same = [r == e for r, e in zip(read, expected)]
    assert sum(same) == 2
    assert not same[[f.path for f in stored.files].index("fixture.txt")]


def test_the_cli_stops_before_the_token_limit_and_writes_atomically(indexed, tmp_path, capsys):
    out = tmp_path / "corpus.jsonl"
    assert main(["index", "export", str(indexed), "--sglang", str(out), "--max-tokens", "30", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["tokens"] <= 30 and report["left_out"] >= 1 and report["files"] + report["left_out"] == 3
    assert len(out.read_text().splitlines()) == report["files"]
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
