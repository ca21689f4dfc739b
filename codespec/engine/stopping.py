"""When a generation ends: EOS, the token limit, a stop string, a dedent (llama.cpp's
`n_indent`: after the first line, a non-blank line indented less than `min_indent`), or
a text rule (`end_at`: where a fill-in-the-middle's block ends or it meets the suffix).

A verify pass may commit several tokens at once; they are checked one by one, in order,
so that speculative and plain decoding stop at exactly the same token.

>>> stop = StopCondition(eos_ids={0}, max_new_tokens=10)
>>> stop.admit([5, 6], [7, 0, 8])          # EOS ends it; EOS itself is not output
([7], 'stop')
>>> StopCondition(eos_ids=set(), max_new_tokens=3).admit([5], [6, 7, 8])
([6, 7], 'length')
"""

from __future__ import annotations

from typing import Callable, Collection, Sequence

from codespec.errors import RequestError

Decode = Callable[[Sequence[int]], str]


class StopCondition:
    """Decides how many newly committed tokens a request keeps, and whether it is done."""

    def __init__(
        self,
        eos_ids: Collection[int],
        max_new_tokens: int,
        stop: Sequence[str] = (),
        decode: Decode | None = None,
        min_indent: int = 0,
        end_at: Callable[[str], tuple[int, int] | None] | None = None,
    ) -> None:
        if max_new_tokens < 1:
            raise RequestError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
        if any(not s for s in stop):
            raise RequestError("stop strings must not be empty")
        if (stop or min_indent or end_at) and decode is None:
            raise RequestError("stop strings, n_indent and text rules need a tokenizer to decode the output")
        self.eos_ids = frozenset(eos_ids)
        self.max_new_tokens = max_new_tokens
        self.stop = tuple(stop)
        self.decode = decode
        self._longest_stop = max((len(s) for s in stop), default=0)
        self.min_indent = min_indent
        self.end_at = end_at
        self.text_end: int | None = None  # where the output text ends, when a stop string or dedent hit

    def admit(self, generated: Sequence[int], new: Sequence[int]) -> tuple[list[int], str | None]:
        """The prefix of `new` to commit after `generated`, and the finish reason if done."""
        kept: list[int] = []
        reason: str | None = None
        for token in new:
            if token in self.eos_ids:
                reason = "stop"
                break
            kept.append(token)
            if len(generated) + len(kept) >= self.max_new_tokens:
                reason = "length"
                break
        if (self.stop or self.min_indent or self.end_at) and kept:
            assert self.decode is not None
            before = self.decode(generated)
            text = self.decode([*generated, *kept])
            rule = self.end_at(text) if self.end_at is not None else None
            cuts = [cut for cut in (self._stop_string_cut(before, text), self._dedent_cut(before, text), rule)
                    if cut is not None]
            if cuts:
                # the rule plain decoding meets first: the one whose reach the fewest tokens
                # cover (ties: the earliest end), not the earliest end among rules that
                # only tokens further on complete (a stop string after a text rule's line)
                needed, self.text_end = min((self._tokens_reaching(generated, kept, reach), end)
                                            for end, reach in cuts)
                return kept[:needed], "stop"
        return kept, reason

    def _stop_string_cut(self, before: str, text: str) -> tuple[int, int] | None:
        """When a stop string appears in the new text: (where the output ends, its start;
        how far the tokens kept must reach, its end)."""
        if not self.stop:
            return None
        search_from = max(0, len(before) - self._longest_stop + 1)
        hits = [(i, s) for s in self.stop if (i := text.find(s, search_from)) >= 0]
        if not hits:
            return None
        start, stop = min(hits)
        return start, start + len(stop)

    def _dedent_cut(self, before: str, text: str) -> tuple[int, int] | None:
        """When a line after the first is indented less than `min_indent`: (where the
        output ends, that line's first character, its indentation kept as llama.cpp
        keeps it; how far the tokens kept must reach, past that character). Only lines
        that reach into the new text are looked at."""
        if not self.min_indent:
            return None
        newline = before.rfind("\n")
        if newline < 0:
            newline = text.find("\n")
        while newline >= 0:
            start = at = newline + 1
            while at < len(text) and text[at] in " \t":
                at += 1
            if at < len(text) and text[at] != "\n" and at - start < self.min_indent:
                return at, at + 1
            newline = text.find("\n", start)
        return None

    def _tokens_reaching(self, generated: Sequence[int], kept: list[int], reach: int) -> int:
        """The fewest of `kept` whose text is at least `reach` characters long."""
        assert self.decode is not None
        for n in range(1, len(kept) + 1):
            if len(self.decode([*generated, *kept[:n]])) >= reach:
                return n
        return len(kept)
