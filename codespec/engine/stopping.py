"""When a generation ends: EOS, the token limit, or a stop string.

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
    ) -> None:
        if max_new_tokens < 1:
            raise RequestError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
        if any(not s for s in stop):
            raise RequestError("stop strings must not be empty")
        if stop and decode is None:
            raise RequestError("stop strings need a tokenizer to decode the output")
        self.eos_ids = frozenset(eos_ids)
        self.max_new_tokens = max_new_tokens
        self.stop = tuple(stop)
        self.decode = decode
        self._longest_stop = max((len(s) for s in stop), default=0)
        self.text_end: int | None = None  # where the output text ends, when a stop string hit

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
        if self.stop and kept:
            cut = self._stop_string_cut(generated, kept)
            if cut is not None:
                return kept[:cut], "stop"
        return kept, reason

    def _stop_string_cut(self, generated: Sequence[int], kept: list[int]) -> int | None:
        """How many of `kept` to keep when a stop string appears in the new text: the
        fewest that complete it. Sets `text_end` to where the string starts."""
        assert self.decode is not None
        before = self.decode(generated)
        text = self.decode([*generated, *kept])
        search_from = max(0, len(before) - self._longest_stop + 1)
        hits = [(i, s) for s in self.stop if (i := text.find(s, search_from)) >= 0]
        if not hits:
            return None
        start, stop = min(hits)
        end = start + len(stop)
        for n in range(1, len(kept) + 1):
            if len(self.decode([*generated, *kept[:n]])) >= end:
                self.text_end = start
                return n
        self.text_end = start
        return len(kept)
