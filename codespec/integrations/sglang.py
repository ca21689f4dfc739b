"""The repository index as SGLang's external n-gram corpus (`codespec index export --sglang`).

SGLang's NGRAM speculation can load a corpus into its suffix automaton at start-up
(`--speculative-ngram-external-corpus-path FILE`) or at run time (`POST
/add_external_corpus`). The file is JSON Lines, one JSON string per document; SGLang
tokenizes each with the served model's tokenizer (`encode(text,
add_special_tokens=False)`) and separates documents with a token of its own. So the
export writes each indexed file's tokens back as its text, one line per file, and
checks that SGLang's tokenization gives back the indexed tokens: a file that spells a
special token (`<|endoftext|>` in a test fixture) re-tokenizes differently, and the
report counts it.

SGLang refuses a corpus over `--speculative-ngram-external-corpus-max-tokens` (default
10,000,000, separators included): the export stops before that limit and says how many
files it left out.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from codespec.index import SuffixIndex

SGLANG_MAX_TOKENS = 10_000_000  # SGLang's default external-corpus limit


@dataclass
class ExportReport:
    path: str
    files: int  # documents written
    tokens: int  # SGLang's count: document tokens plus one separator between documents
    left_out: int  # files beyond the token limit
    retokenized: int  # documents whose SGLang tokenization differs from the index's tokens
    bytes: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def export_corpus(index: SuffixIndex, tokenizer: Any, out: Path, *, max_tokens: int = SGLANG_MAX_TOKENS,
                  progress: bool = True) -> ExportReport:
    """Write the static index's files as SGLang's JSONL corpus, atomically."""
    if index.static is None:
        raise ValueError("the index has no repository snapshot to export")
    stored = index.static.stored
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    files = tokens = retokenized = 0
    entries = [f for f in stored.files if f.end > f.start]
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for entry in tqdm(entries, desc="export", unit="file", disable=not progress):
                ids = stored.corpus[entry.start:entry.end].tolist()
                cost = len(ids) + (1 if files else 0)
                if tokens + cost > max_tokens:
                    break
                text = tokenizer.decode(ids)
                if tokenizer.encode(text, add_special_tokens=False) != ids:
                    retokenized += 1
                f.write(json.dumps(text, ensure_ascii=False) + "\n")
                files, tokens = files + 1, tokens + cost
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return ExportReport(str(out), files, tokens, len(entries) - files, retokenized, out.stat().st_size)
