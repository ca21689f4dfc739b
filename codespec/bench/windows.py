"""Editor-like windows of source text: whole lines that fit a token budget."""

from __future__ import annotations

from typing import Any

FIM_PREFIX_TOKENS = 1024  # editor-like budget: ~1k tokens before the cursor,
FIM_SUFFIX_TOKENS = 256  # a quarter of that after it


def keep_tail(tokenizer: Any, text: str, budget: int) -> str:
    """The longest run of whole trailing lines that fits in `budget` tokens."""
    kept: list[str] = []
    used = 0
    for line in reversed(text.splitlines(keepends=True)):
        used += len(tokenizer(line, add_special_tokens=False)["input_ids"])
        if used > budget:
            break
        kept.append(line)
    return "".join(reversed(kept))


def keep_head(tokenizer: Any, text: str, budget: int) -> str:
    """The longest run of whole leading lines that fits in `budget` tokens."""
    kept: list[str] = []
    used = 0
    for line in text.splitlines(keepends=True):
        used += len(tokenizer(line, add_special_tokens=False)["input_ids"])
        if used > budget:
            break
        kept.append(line)
    return "".join(kept)
