"""A next-edit request: the window the model rewrites, and the edits its rewrite makes.

The model sees the file around the cursor, the recent edits and an editable window of
whole lines (`WINDOW_ABOVE` lines above the cursor's line, `WINDOW_BELOW` below, as
Sweep's next-edit models take it), and writes the window again with the edit it
predicts. Most of the rewrite copies the window, so the window is the request's
prediction (index/prediction.py): drafts follow it and re-join it after each change.

`edits` turns a rewrite into the smallest changes: the lines difflib finds changed,
each trimmed to the characters that differ, as (start, end, text) offsets into the
document. `rejoined_end` is a stop rule: once the rewrite changed something and then
copied `REJOIN_LINES` lines of the window again, the rest is taken to be the window's
(the answer goes out there), the same stop for plain and speculative decoding.

>>> w = Window.around("a = 1\\nb = a + 1\\nprint(b)\\n", 0, above=0, below=2)
>>> w.text
'a = 1\\nb = a + 1\\nprint(b)\\n'
>>> edits(w, "a = 1\\nb = a + 2\\nprint(b)\\n")
[Edit(start=14, end=15, text='2')]
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass

WINDOW_ABOVE, WINDOW_BELOW = 10, 10  # Sweep's 21-line window
REJOIN_LINES = 3  # window lines copied after a change that end the rewrite
MAX_WINDOW_CHARS = 16_000  # a window of longer lines is cut to the cursor's neighbourhood


@dataclass(frozen=True)
class Edit:
    """Replace document[start:end] with `text` (offsets into the document's text)."""

    start: int
    end: int
    text: str


@dataclass(frozen=True)
class Window:
    """Lines [first, last) of a document: `text` starts at offset `start`."""

    document: str
    first: int
    last: int
    start: int
    text: str

    @classmethod
    def around(cls, document: str, line: int, above: int = WINDOW_ABOVE, below: int = WINDOW_BELOW) -> Window:
        """The window of whole lines around `line` (clamped to the document)."""
        lines = document.splitlines(keepends=True)
        line = max(0, min(line, max(len(lines) - 1, 0)))
        first, last = max(0, line - above), min(len(lines), line + below + 1)
        while last - first > 1 and sum(len(x) for x in lines[first:last]) > MAX_WINDOW_CHARS:
            if line - first > last - 1 - line:
                first += 1
            else:
                last -= 1
        start = sum(len(x) for x in lines[:first])
        return cls(document, first, last, start, "".join(lines[first:last]))

    @property
    def before(self) -> str:
        return self.document[: self.start]

    @property
    def after(self) -> str:
        return self.document[self.start + len(self.text):]


def edits(window: Window, rewrite: str) -> list[Edit]:
    """The changes that turn the window into `rewrite`, smallest first in the document's
    order (none when the rewrite is the window)."""
    old, new = window.text.splitlines(keepends=True), rewrite.splitlines(keepends=True)
    if window.text.endswith("\n") and rewrite and not rewrite.endswith("\n") and new:
        new[-1] += "\n"  # a rewrite that stopped at the window's last line end keeps it
    found: list[Edit] = []
    offsets = [window.start]
    for line in old:
        offsets.append(offsets[-1] + len(line))
    matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        before, after = "".join(old[i1:i2]), "".join(new[j1:j2])
        head = len(os.path.commonprefix([before, after]))
        tail = len(os.path.commonprefix([before[head:][::-1], after[head:][::-1]]))
        found.append(Edit(offsets[i1] + head, offsets[i2] - tail, after[head: len(after) - tail]))
    return found


def position(text: str, offset: int) -> tuple[int, int]:
    """An offset into `text` as (line, character), characters in code points.

    >>> position("ab\\ncd", 4)
    (1, 1)
    """
    line = text.count("\n", 0, offset)
    return line, offset - (text.rfind("\n", 0, offset) + 1)


def merged(text: str, found: list[Edit]) -> tuple[int, int, str]:
    """Edits of `text` as one span and its replacement ((0, 0, "") for none): what a
    client that takes one edit (Copilot's inline edit, Sweep's range) is given.

    >>> merged("a b c d", [Edit(0, 1, "A"), Edit(4, 5, "C")])
    (0, 5, 'A b C')
    """
    if not found:
        return 0, 0, ""
    first, last = min(e.start for e in found), max(e.end for e in found)
    span = text[first:last]
    for edit in sorted(found, key=lambda e: -e.start):
        span = span[: edit.start - first] + edit.text + span[edit.end - first:]
    return first, last, span


def rejoined_end(window_text: str, rejoin: int = REJOIN_LINES):
    """`GenerationConfig.end_at`'s rule for a rewrite of `window_text`: the output ends
    after the line at which it first has changed the window and then copied `rejoin` of
    its lines in a row (or its last line) again; None before that. Decided on whole lines
    and on the shortest output that meets it, so a longer output ends at the same place.

    >>> end = rejoined_end("a\\nb\\nc\\nd\\ne\\nf\\n", rejoin=2)
    >>> end("a\\nB\\nc\\n") is None, end("a\\nB\\nc\\nd\\ne")
    (True, (8, 8))
    """
    window = window_text.splitlines(keepends=True)

    def end_at(raw: str) -> tuple[int, int] | None:
        lines = raw.splitlines(keepends=True)
        complete = lines if raw.endswith("\n") else lines[:-1]
        position = 0
        for n in range(1, len(complete) + 1):
            position += len(complete[n - 1])
            if _rejoined_at(window, complete[:n], rejoin) is not None:
                return position, position
        return None

    return end_at


def completed(window_text: str, output: str) -> str:
    """The whole rewrite from an output that covers part of the window: the window's
    lines before the part it starts copying and after the part it last copied are kept
    (a rewrite stopped where it re-joined the window, or a model that wrote only the
    lines it changed, leaves the others as they are). Changed lines before the first
    copy, or after the last, replace as many window lines.

    >>> completed("a\\nb\\nc\\nd\\ne\\n", "a\\nB\\nc\\nd\\n")
    'a\\nB\\nc\\nd\\ne\\n'
    >>> completed("a\\nb\\nc\\nd\\ne\\n", "C\\nd\\n")   # only the lines around the change
    'a\\nb\\nC\\nd\\ne\\n'
    """
    window, lines = window_text.splitlines(keepends=True), output.splitlines(keepends=True)
    blocks = [b for b in difflib.SequenceMatcher(None, window, lines, autojunk=False).get_matching_blocks() if b.size]
    if not blocks:
        return output
    first, last = blocks[0], blocks[-1]
    head = window[: max(0, first.a - first.b)]
    tail = window[last.a + last.size + (len(lines) - last.b - last.size):]
    return "".join(head) + output + "".join(tail)


def _rejoined_at(window: list[str], lines: list[str], rejoin: int) -> int | None:
    """Where in the window `lines` re-joined it (the line after the last one copied), when
    they changed it and then copied `rejoin` of its lines in a row, or its last line,
    up to the last line written; else None."""
    if lines == window[: len(lines)]:
        return None  # nothing changed yet
    blocks = [b for b in difflib.SequenceMatcher(None, window, lines, autojunk=False).get_matching_blocks() if b.size]
    if not blocks or blocks[-1].b + blocks[-1].size != len(lines):
        return None  # the last line written is not a copy
    last = blocks[-1]
    if last.size >= rejoin or last.a + last.size == len(window):
        return last.a + last.size
    return None
