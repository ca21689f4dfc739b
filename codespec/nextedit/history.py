"""A document's recent edits, as a next-edit request shows them to the model.

The language server hands every new text of a document to `EditHistory.update` (from
`didChange`). Keystrokes near each other make one hunk: the lines that differ between
the text when the hunk opened and the text now (common leading and trailing lines
trimmed). An edit farther than `NEAR` lines from the open hunk closes it and opens
another; so does an edit in another document. Closed hunks are kept, newest last, at
most `PER_DOCUMENT` per document and `TOTAL` in all; a hunk's sides are cut to
`MAX_LINES` lines each. A hunk whose text came back to what it was is dropped.

>>> h = EditHistory()
>>> h.update("a.py", "def f(x):\\n    return x\\n")          # the first text: nothing to compare
>>> h.update("a.py", "def f(y):\\n    return x\\n")
>>> h.update("a.py", "def f(y):\\n    return y\\n")          # the next line: the same hunk
>>> [(e.start, e.before, e.after) for e in h.recent("a.py")]
[(0, 'def f(x):\\n    return x\\n', 'def f(y):\\n    return y\\n')]
>>> print(h.recent("a.py")[0].diff("a.py"))
--- a/a.py
+++ b/a.py
@@ -1,2 +1,2 @@
-def f(x):
-    return x
+def f(y):
+    return y
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

NEAR = 3  # lines between an edit and the open hunk that still make one hunk
PER_DOCUMENT = 8  # closed hunks kept per document
TOTAL = 24  # closed hunks kept in all
MAX_LINES = 40  # lines kept of each side of a hunk
MAX_DOCUMENT_CHARS = 2_000_000  # a larger text is not compared (its edits are not kept)


@dataclass(frozen=True)
class Change:
    """Lines `start`.. of a document read `before` and now read `after` (whole lines)."""

    uri: str
    start: int
    before: str
    after: str

    def diff(self, path: str) -> str:
        """The edit as a unified diff of `path` (one hunk, no context lines)."""
        before, after = self.before.splitlines(), self.after.splitlines()
        lines = [f"--- a/{path}", f"+++ b/{path}",
                 f"@@ -{self.start + 1},{len(before)} +{self.start + 1},{len(after)} @@",
                 *(f"-{line}" for line in before), *(f"+{line}" for line in after)]
        return "\n".join(lines)


@dataclass
class _Open:
    """The hunk being typed: the document's lines when it opened, and where it is now."""

    base: list[str]
    first: int  # in the current text: the hunk's first line
    last: int  # ... and the line after its last


class EditHistory:
    def __init__(self) -> None:
        self._texts: dict[str, list[str]] = {}  # each document's last text, as lines
        self._open: dict[str, _Open] = {}
        self._closed: deque[Change] = deque()
        self._active: str | None = None  # the document of the last edit

    def update(self, uri: str, text: str) -> None:
        """The document's text now (after a change, or when opened)."""
        if len(text) > MAX_DOCUMENT_CHARS:
            self.forget(uri)
            return
        lines = text.splitlines(keepends=True)
        previous = self._texts.get(uri)
        self._texts[uri] = lines
        if previous is None or previous == lines:
            return
        first, old_end, new_end = _changed(previous, lines)
        if self._active not in (None, uri):
            self._close(self._active)
        self._active = uri
        hunk = self._open.get(uri)
        if hunk is not None:
            # the open hunk's span in the new text: lines after the change shift by its size
            def moved(line: int) -> int:
                return line if line <= first else (line + new_end - old_end if line >= old_end else new_end)

            start, end = moved(hunk.first), moved(hunk.last)
            if first <= end + NEAR and new_end + NEAR >= start:
                hunk.first, hunk.last = min(start, first), max(end, new_end)
                return
            self._close(uri, previous)  # the hunk as it was before this far edit
        self._open[uri] = _Open(previous, first, new_end)

    def recent(self, uri: str | None = None) -> list[Change]:
        """The kept edits, oldest first, the open hunk last (one document's, or all)."""
        edits = [e for e in self._closed if uri is None or e.uri == uri]
        for key in ([uri] if uri is not None else list(self._open)):
            edit = self._edit(key) if key in self._open else None
            if edit is not None:
                edits.append(edit)
        return edits

    def forget(self, uri: str) -> None:
        """A closed document: its text and open hunk go (its closed hunks stay)."""
        self._texts.pop(uri, None)
        self._open.pop(uri, None)
        if self._active == uri:
            self._active = None

    def _close(self, uri: str, lines: list[str] | None = None) -> None:
        edit = self._edit(uri, lines)
        self._open.pop(uri, None)
        if edit is None:
            return
        self._closed.append(edit)
        mine = [e for e in self._closed if e.uri == uri]
        if len(mine) > PER_DOCUMENT:
            self._closed.remove(mine[0])
        while len(self._closed) > TOTAL:
            self._closed.popleft()

    def _edit(self, uri: str, lines: list[str] | None = None) -> Change | None:
        """The open hunk as an edit: its base against `lines` (default: the text now),
        trimmed to what differs."""
        hunk = self._open[uri]
        lines = self._texts.get(uri, []) if lines is None else lines
        first, old_end, new_end = _changed(hunk.base, lines)
        if first == old_end == new_end:
            return None  # typed and taken back
        before, after = hunk.base[first:old_end][:MAX_LINES], lines[first:new_end][:MAX_LINES]
        return Change(uri, first, "".join(before), "".join(after))


def _changed(old: list[str], new: list[str]) -> tuple[int, int, int]:
    """The lines that differ: (first, end in old, end in new), common lines trimmed from
    both ends."""
    first = 0
    limit = min(len(old), len(new))
    while first < limit and old[first] == new[first]:
        first += 1
    tail = 0
    while tail < limit - first and old[-1 - tail] == new[-1 - tail]:
        tail += 1
    return first, len(old) - tail, len(new) - tail


def parse_changes(diff: str, path: str = "") -> list[Change]:
    """Changes from unified-diff text: hunks under `File: PATH` lines (Sweep's
    `recent_changes`) or `+++ b/PATH` headers, each `@@ -a,b +c,d @@` hunk one change
    (its context lines on both sides).

    >>> [(c.uri, c.start, c.before, c.after) for c in parse_changes("File: m.py\\n@@ -3,1 +3,1 @@\\n-a = 1\\n+a = 2\\n")]
    [('m.py', 2, 'a = 1\\n', 'a = 2\\n')]
    """
    changes: list[Change] = []
    current: list[list[str]] | None = None  # [before lines, after lines] of the hunk being read
    start = 0

    def close() -> None:
        if current is not None and current[0] != current[1]:
            changes.append(Change(path, start, "".join(current[0]), "".join(current[1])))

    for line in diff.splitlines():
        if line.startswith("File: ") or line.startswith("+++ "):
            close()
            current = None
            name = line[len("File: "):] if line.startswith("File: ") else line[4:]
            path = name[2:] if name.startswith("b/") else name
        elif line.startswith("--- "):
            continue
        elif line.startswith("@@"):
            close()
            try:
                start = max(0, int(line.split()[1].lstrip("-").split(",")[0]) - 1)
            except (IndexError, ValueError):
                start = 0
            current = [[], []]
        elif current is not None and line[:1] in ("-", "+", " ", ""):  # "": a context line's space dropped
            sign, body = line[:1], line[1:] + "\n"
            if sign != "+":
                current[0].append(body)
            if sign != "-":
                current[1].append(body)
    close()
    return changes
