"""A request's predicted output as a draft source (OpenAI's Predicted Outputs).

An agent that rewrites a file it holds knows most of the answer: the file itself. It
sends it as `prediction`, and the request drafts from it as from its own prompt, with a
copy pointer: while the output copies the prediction, the next draft is the prediction's
next tokens (one lookup, no search); where the output leaves it, the pointer is lost and
the context's last tokens are looked up in the prediction again, nearest after where the
copy was (a rewrite moves forward through the file), so the copy resumes after the change.

The drafts only propose: the verifier keeps what the model would have written anyway, so
the output is the same with any prediction or none (engine/ and the lossless tests).

>>> p = PredictionMatcher([1, 2, 3, 4, 5, 6])
>>> p.draft([9, 1, 2], max_tokens=3).token_ids     # [1, 2] found: what follows it
(3, 4, 5)
>>> p.extend([3, 4]); p.draft([9, 1, 2, 3, 4], max_tokens=8).token_ids   # copying: the rest
(5, 6)
"""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from codespec.index import search
from codespec.index.draft import Draft

SOURCE = "prediction"
MAX_MATCH = 64  # context tokens looked up (longer matches add nothing to the choice)
_ONE_DOCUMENT = (np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.bool_))  # scan_longest_match's doc table


class PredictionMatcher:
    """Drafts from one request's predicted output: a copy pointer, else a suffix match."""

    def __init__(self, tokens: Sequence[int]) -> None:
        self.tokens = np.asarray(tokens, dtype=np.int32)
        self.pos: int | None = None  # the next prediction token the output is expected to copy
        self.copied = 0  # tokens copied in a row from the pointer, the match included
        self.last = 0  # where the last copy was (a new match is looked for from here on first)

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    def extend(self, committed: Iterable[int]) -> None:
        """The output committed these tokens: the pointer follows while they copy."""
        for token in committed:
            if self.pos is not None and self.pos < len(self) and self.tokens[self.pos] == token:
                self.pos += 1
                self.copied += 1
                self.last = self.pos
            else:
                self.pos, self.copied = None, 0

    def draft(self, context: Sequence[int] | np.ndarray, max_tokens: int) -> Draft:
        """The prediction's continuation of `context` (the request's prompt and output),
        at most `max_tokens` long; `match_len` is how much agreement it rests on."""
        if max_tokens <= 0 or not len(self):
            return Draft.empty(SOURCE)
        if self.pos is None or self.pos >= len(self):
            self._find(np.asarray(context[-MAX_MATCH:], dtype=np.int32))
        if self.pos is None or self.pos >= len(self):
            return Draft.empty(SOURCE)
        ids = self.tokens[self.pos : self.pos + max_tokens].tolist()
        return Draft.chain(ids, [1] * len(ids), match_len=self.copied, source=SOURCE)

    def _find(self, context: np.ndarray) -> None:
        """Point after the longest match of the context's end in the prediction; among
        equally long ones, the first at or after the last copy (else the first)."""
        length, ends = search.scan_longest_match(self.tokens, len(self), context, MAX_MATCH, *_ONE_DOCUMENT, -1)
        if length == 0 or not ends.size:
            return
        ahead = ends[ends + 1 >= self.last]
        end = int(ahead[0] if ahead.size else ends[0])
        self.pos, self.copied = end + 1, int(length)

    def state(self) -> tuple[int | None, int, int]:
        return self.pos, self.copied, self.last

    def set_state(self, state: tuple[int | None, int, int]) -> None:
        self.pos, self.copied, self.last = state


def prediction_usage(prediction: Sequence[int], output: Sequence[int]) -> tuple[int, int]:
    """OpenAI's `accepted_prediction_tokens` and `rejected_prediction_tokens`: the
    prediction's tokens that appear in the output, in order (the longest matching blocks,
    as difflib finds them), and the others.

    >>> prediction_usage([1, 2, 3, 4, 5], [1, 2, 9, 4, 5, 6])
    (4, 1)
    """
    import difflib

    matcher = difflib.SequenceMatcher(None, list(prediction), list(output), autojunk=False)
    accepted = sum(block.size for block in matcher.get_matching_blocks())
    return accepted, len(prediction) - accepted
