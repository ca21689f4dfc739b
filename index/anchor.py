"""Copy anchors: where an edit's output resumes copying after it changed something.

An edit answer copies the code it was given, except where it changes it. At a change
the longest suffix match breaks: after `room` replaced `space_left`, the context ends in
tokens that occur nowhere (no draft) or somewhere unrelated (the instruction that named
the new identifier; a wrong draft). Plain suffix matching needs two or three passes
to find its place again, at every changed occurrence.

The anchor remembers where the output was copying from: the next source token expected
(`pos`), set by every long match and advanced by every copied token. A short match is a
candidate that becomes the anchor once the output has copied `ANCHOR_MIN_MATCH` tokens
from it, counting the match: a deep draft from a 2-token match that the model accepted
for 15 tokens is as good evidence as a 17-token match. After a deviation
it proposes, first, a *local* match: the context's last tokens found just after the
anchor (the output resumed copying, e.g. ` = width` after an inserted `_value`); and
otherwise *guesses*: the source continuing at the anchor, or one or two tokens past it
(the changed text replaced that many source tokens). Guesses are cheap tree branches;
the verifier keeps what the model would have written anyway, so a wrong guess costs
rows, never output.

    source: ... space _left ␣= ␣width ...        output: ... space _left _value
    anchor at ␣= (after _left); `_value` deviates  -> guesses ␣= ␣width ... (insertion),
                                                      ␣width ... (one token replaced), ...
"""

from __future__ import annotations

import numpy as np

from codespec.index.draft import Draft

SOURCE = "anchor"  # a resumed copy (local match)
GUESS = "anchor-guess"  # continuations guessed at the anchor
ANCHOR_MIN_MATCH = 6  # a match at least this long says where the output is copying from
WINDOW = 12  # how far past the anchor a resumed copy is looked for
GUESSES = 3  # branches at the anchor and 1, 2 tokens past it (tree drafts; chains take the first)
MAX_DEVIATION = 24  # tokens after which a deviation is a rewrite, not an edit: forget the anchor
GUESS_SPAN = 4  # guesses only this many tokens into a deviation (an edit's change is short; past
# that the output is writing new code, as in most of a FIM completion, and matches draft better)


class CopyAnchor:
    def __init__(self) -> None:
        self.pos: int | None = None  # index of the next expected source token
        self.off = 0  # tokens produced since the copy stopped matching
        self.copied = 0  # tokens the output has copied from here, the match included

    @property
    def anchored(self) -> bool:
        return self.pos is not None and self.copied >= ANCHOR_MIN_MATCH

    def extend(self, buf: np.ndarray, start: int, count: int) -> None:
        """`buf[start:start + count]` were just committed."""
        for i in range(start, start + count):
            if self.pos is None:
                return
            if self.off == 0 and self.pos < start and buf[self.pos] == buf[i]:
                self.pos += 1  # still copying
                self.copied += 1
            elif not self.anchored:
                self.pos = None  # a candidate that stopped copying too soon
            else:
                self.off += 1
                if self.off > MAX_DEVIATION:
                    self.pos = None

    def observe(self, match_len: int, ends: np.ndarray) -> None:
        """The context's longest match: a long one (re)sets the anchor after its latest
        occurrence; a short one is a candidate unless an anchor holds."""
        if ends.size and (match_len >= ANCHOR_MIN_MATCH or (match_len and not self.anchored)):
            self.pos, self.off, self.copied = int(ends[-1]) + 1, 0, match_len

    def draft(self, buf: np.ndarray, n: int, max_tokens: int, tree: bool) -> Draft:
        """A draft from the anchor while the output deviates from its copy (else empty)."""
        if self.pos is None or not self.anchored or self.off == 0 or max_tokens <= 0 or n < 2:
            return Draft.empty(SOURCE)
        best_end, best_len = -1, 0
        for end in range(max(self.pos - 1, 0), min(self.pos + WINDOW, n - 1)):
            length = 0
            while length < self.off and end - length >= 0 and buf[end - length] == buf[n - 1 - length]:
                length += 1
            if length > best_len:
                best_end, best_len = end, length
        if best_len:
            self.pos, self.off = best_end + 1, 0  # the copy resumed there
            return _chain(buf, best_end + 1, n, max_tokens, best_len)
        if self.off > GUESS_SPAN:
            return Draft.empty(SOURCE)
        starts = [self.pos + s for s in range(GUESSES if tree else 1) if self.pos + s < n]
        if not starts:
            return Draft.empty(SOURCE)
        depth = max(1, max_tokens // len(starts))
        tokens: list[int] = []
        parents: list[int] = []
        for start in starts:
            branch = buf[start : min(start + depth, n)].tolist()
            parents += [-1] + [len(tokens) + j for j in range(len(branch) - 1)]
            tokens += branch
        return Draft(tuple(tokens), tuple(parents), (1,) * len(tokens), 1, GUESS)


def _chain(buf: np.ndarray, start: int, n: int, max_tokens: int, match_len: int) -> Draft:
    ids = buf[start : min(start + max_tokens, n)].tolist()
    return Draft.chain(ids, [1] * len(ids), match_len=match_len, source=SOURCE)
