"""Work before the person asks: the prompt of the next likely request, handed
to the backend to prefill in idle time.

Once a document is opened or edited and then left alone for `IDLE_S`, the next request
will most likely come where the person is: at the end of the last edit (found by
comparing the text with the one seen before), else where the last request was. For a
file never asked about, the cursor is unknown: in the `psm` layout a prompt at the
file's end still shares its leading chunks with any request in a short file (the
window before the cursor starts at the file's start), and with other files' code the
prompt's head is the same wherever the cursor is; in `spm` without other files' code
nothing of such a guess would be reused (the text after the cursor comes first), so
nothing is sent. The backend computes the prompt's whole chunks while no request runs;
a request pre-empts the work (engine/scheduler.py), and reuses what is done.

    ahead = Ahead(send=backend.prefill_ahead, document=lambda uri: (text, path, extra), options=lambda: opts)
    ahead.changed(uri)          # didOpen, didChange: prefill once the person pauses
    ahead.asked(uri, text, offset)   # a request came: its own prefill does the work
    ahead.closed(uri)
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable

from codespec.lsp.backend import FimRequest
from codespec.lsp.window import fim_request

IDLE_S = 0.3  # a pause this long after a change: the person is reading or thinking
BLOCK = 4096  # characters compared at a time when looking for the edit


class Ahead:
    def __init__(self, send: Callable[[str, FimRequest | None], None],
                 document: Callable[[str], tuple[str, str, Any] | None], options: Callable[[], Any]) -> None:
        """`send(uri, request)`: the backend's `prefill_ahead` (None forgets the uri's);
        `document(uri)`: (text, workspace path, cross-file context) of an open document,
        else None."""
        self.send, self.document, self.options = send, document, options
        self.cursors: dict[str, int] = {}  # uri -> where the person last was (an offset)
        self.seen: dict[str, str] = {}  # uri -> the text that cursor belongs to
        self._timers: dict[str, asyncio.TimerHandle] = {}

    def changed(self, uri: str) -> None:
        """The document was opened or edited: prefill once the person pauses."""
        self._cancel(uri)
        self._timers[uri] = asyncio.get_running_loop().call_later(IDLE_S, self._fire, uri)

    def asked(self, uri: str, text: str, offset: int) -> None:
        """A request at `offset`: its prefill does this work; the cursor is known."""
        self._cancel(uri)
        self.cursors[uri], self.seen[uri] = offset, text

    def closed(self, uri: str) -> None:
        """The cursor is kept: a file reopened is most likely edited where it was left."""
        self._cancel(uri)
        self.seen.pop(uri, None)
        self.send(uri, None)

    def _cancel(self, uri: str) -> None:
        timer = self._timers.pop(uri, None)
        if timer is not None:
            timer.cancel()

    def _fire(self, uri: str) -> None:
        self._timers.pop(uri, None)
        found = self.document(uri)
        if found is None or not self.options().enable:
            return
        text, path, extra = found
        before = self.seen.get(uri)
        if before is not None and before != text:
            self.cursors[uri] = edit_end(before, text)
        self.seen[uri] = text
        options = self.options()
        known = self.cursors.get(uri)
        if known is None and options.fim_layout == "spm" and not extra:
            return  # a guessed cursor's prompt shares nothing with the real one's (module docstring)
        offset = min(len(text) if known is None else known, len(text))
        request, _ = fim_request(text, offset, options, path, extra)
        self.send(uri, request)


def edit_end(before: str, after: str) -> int:
    """Where in `after` the change from `before` ends: the cursor after typing, pasting or
    deleting there (one edit; for several, the end of the last).

    >>> edit_end("def f():\\n    pass\\n", "def f():\\n    x = 1\\n    pass\\n")  # before "pass"
    23
    >>> edit_end("abcdef", "abef"), edit_end("abc", "abc!")
    (2, 4)
    """
    same = _common(len(before), len(after), lambda i, j: before[i:j] == after[i:j])
    limit = min(len(before), len(after)) - same  # the common tail may not overlap the head
    b, a = len(before), len(after)
    tail = _common(limit, limit, lambda i, j: before[b - j:b - i] == after[a - j:a - i])
    return len(after) - tail


def _common(first: int, second: int, equal: Callable[[int, int], bool]) -> int:
    """How many leading units two sequences share, compared a block at a time (C speed for
    megabytes), then one at a time inside the first block that differs."""
    n, at = min(first, second), 0
    while at < n and equal(at, min(at + BLOCK, n)):
        at = min(at + BLOCK, n)
    while at < n and equal(at, at + 1):
        at += 1
    return at
