"""Committed tokens -> text increments that are safe to show while streaming.

Two things are held back until they are certain: an incomplete UTF-8 character at the
end (byte-level BPE splits characters across tokens; the decoder shows U+FFFD until the
rest arrives) and the last `len(longest stop string) - 1` characters, which may be the
start of a stop string that the final text will not contain. With `min_indent` (llama.cpp's
`n_indent`), a last line indented less than that is held from its first character: the
run ends there. With a text rule (`end_at`, landing/cut.py), whole lines only, and no
trailing blank lines: the rule judges a line once it is complete, and the served text
ends without them.

>>> ts = TextStream(decode=lambda ids: "".join(map(chr, ids)), stop=("END",))
>>> ts.push([104, 105, 32, 69])     # "hi E": "E" may start "END"; 2 chars held back
'hi'
>>> ts.finish("hi ")                # the run stopped at "END": the rest of the final text
' '
>>> TextStream(decode=lambda ids: "".join(map(chr, ids)), stop=("END",)).push([104, 105, 32, 69, 78, 68])
'hi '
"""

from __future__ import annotations

from typing import Callable, Sequence

REPLACEMENT = "\ufffd"
EndAt = Callable[[str], "tuple[int, int] | None"]  # GenerationConfig.end_at: where an output ends, once known


def settled_end(text: str, end_at: EndAt) -> int:
    """How much of `text` a text rule has settled: its whole lines, short of where the
    rule ends the output and of trailing whitespace (which the final text drops).

    >>> settled_end("a = 1\\nb = 2\\n\\nc", lambda t: None)
    11
    """
    cut = end_at(text)
    end = min(text.rfind("\n") + 1, len(text) if cut is None else cut[0])
    return len(text[:end].rstrip())


class IncrementalText:
    """The text of a growing token list, each push decoding only the tokens since the last
    complete character (a byte-level BPE character may span tokens: a piece that ends in
    U+FFFD waits for the next push). The window starts a few tokens back, so merges across
    the boundary decode as in the whole text.

    >>> text = IncrementalText(lambda ids: "".join(map(chr, ids)))
    >>> text.push([104, 105]), text.push([33]), text.text
    ('hi', '!', 'hi!')
    """

    def __init__(self, decode: Callable[[Sequence[int]], str]) -> None:
        self.decode = decode
        self.tokens: list[int] = []
        self.text = ""
        self._prefix = self._read = 0  # tokens [prefix, read) were decoded last time: the window's start

    def push(self, tokens: Sequence[int]) -> str:
        self.tokens.extend(tokens)
        before = self.decode(self.tokens[self._prefix:self._read])
        window = self.decode(self.tokens[self._prefix:])
        if len(window) <= len(before) or window.endswith(REPLACEMENT):
            return ""  # an incomplete character: wait for its other bytes
        piece = window[len(before):]
        self._prefix, self._read = self._read, len(self.tokens)
        self.text += piece
        return piece


class TextStream:
    def __init__(self, decode: Callable[[Sequence[int]], str], stop: Sequence[str] = (),
                 min_indent: int = 0, end_at: EndAt | None = None) -> None:
        self.stop = tuple(stop)
        self.holdback = max((len(s) for s in stop), default=1) - 1
        self.min_indent = min_indent
        self.end_at = end_at
        self.decoded = IncrementalText(decode)  # the tokens since the last whole character decoded, not all
        self.sent = 0  # characters already emitted

    def push(self, tokens: Sequence[int]) -> str:
        self.decoded.push(tokens)
        text = self.decoded.text
        end = len(text) - self.holdback
        newline = text.rfind("\n") if self.min_indent else -1
        if newline >= 0:
            body = text[newline + 1 :].lstrip(" \t")
            indent = len(text) - newline - 1 - len(body)
            if body and indent < self.min_indent:
                end = min(end, newline + 1 + indent)
        # the last tokens may complete a stop string; none starts before what was sent
        hits = [i for s in self.stop if (i := text.find(s, self.sent)) >= 0]
        if hits:
            end = min(end, min(hits))
        if self.end_at is not None:
            end = min(end, settled_end(text, self.end_at))
        while end > self.sent and text[end - 1] == REPLACEMENT:
            end -= 1
        if end <= self.sent:
            return ""
        piece, self.sent = text[self.sent : end], end
        return piece

    def finish(self, final_text: str) -> str:
        """What remains of the run's final text (already cut at any stop string)."""
        rest = final_text[self.sent :]
        self.sent = len(final_text)
        return rest
