"""Logprobs in OpenAI's two shapes, and which of a stream's entries may go out yet.

* `/v1/completions` (legacy): {"tokens", "token_logprobs", "top_logprobs" (a dict per
  token), "text_offset"};
* `/v1/chat/completions`: {"content": [{"token", "logprob", "bytes", "top_logprobs":
  [{"token", "logprob", "bytes"}]}]}.

A token's `bytes` are its own bytes (byte-level BPE splits characters: a token may hold
half of one); its `token` is those bytes as text, with U+FFFD for a partial character.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

from codespec.verify.logprobs import TokenLogprob
from codespec.prompts import TOKENIZER_LOCK


class TokenText:
    """Each token id's bytes and text, looked up once."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    @functools.lru_cache(maxsize=65536)  # noqa: B019 (one per served tokenizer, for the server's life)
    def bytes(self, token: int) -> bytes:
        with TOKENIZER_LOCK:
            piece = self.tokenizer.convert_ids_to_tokens(int(token))
        table = _byte_level()
        if isinstance(piece, str) and piece and all(ch in table for ch in piece):
            return bytes(table[ch] for ch in piece)  # byte-level BPE: one character per byte
        with TOKENIZER_LOCK:  # a special token, or a tokenizer that is not byte-level
            return self.tokenizer.decode([int(token)], skip_special_tokens=False).encode("utf-8")

    def text(self, token: int) -> str:
        return self.bytes(token).decode("utf-8", errors="replace")


@functools.lru_cache(maxsize=1)
def _byte_level() -> dict[str, int]:
    """GPT-2's byte-level alphabet, character -> byte: the printable bytes stand for
    themselves, the other 68 for the characters from U+0100 on, in byte order (built here,
    not imported from transformers, which the torch-free server never loads)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {**{chr(b): b for b in printable}, **{chr(256 + n): b for n, b in enumerate(others)}}


def chat_logprobs(entries: Sequence[TokenLogprob] | None, names: TokenText) -> dict[str, Any] | None:
    if entries is None:
        return None

    def one(token: int, logprob: float) -> dict[str, Any]:
        return {"token": names.text(token), "logprob": logprob, "bytes": list(names.bytes(token))}

    return {"content": [{**one(e.token, e.logprob), "top_logprobs": [one(t, lp) for t, lp in e.top]}
                        for e in entries]}


class CompletionLogprobs:
    """The legacy shape, chunk by chunk: `text_offset` counts on from the last chunk."""

    def __init__(self, names: TokenText) -> None:
        self.names, self.offset = names, 0

    def __call__(self, entries: Sequence[TokenLogprob] | None) -> dict[str, Any] | None:
        if entries is None:
            return None
        tokens, offsets = [], []
        for e in entries:
            text = self.names.text(e.token)
            tokens.append(text)
            offsets.append(self.offset)
            self.offset += len(text)
        return {"tokens": tokens, "token_logprobs": [e.logprob for e in entries],
                "top_logprobs": [{self.names.text(t): lp for t, lp in e.top} for e in entries],
                "text_offset": offsets}


class Release:
    """Which logprob entries a stream may send: those of tokens whose text the stream has
    shown (text held back, a partial character or the start of a stop string, keeps its
    tokens' entries back with it); at the end, the rest of the finished generation's."""

    def __init__(self, decode: Callable[[Sequence[int]], str]) -> None:
        self.decode = decode
        self.tokens: list[int] = []
        self.pending: list[tuple[int, TokenLogprob]] = []  # (where the token's text ends, entry)
        self.released = 0

    def push(self, entries: Sequence[TokenLogprob], shown: int) -> list[TokenLogprob]:
        """Add a step's entries; returns those ready now that `shown` characters are out."""
        for entry in entries:
            self.tokens.append(entry.token)
            self.pending.append((len(self.decode(self.tokens)), entry))
        count = 0
        while count < len(self.pending) and self.pending[count][0] <= shown:
            count += 1
        ready = [entry for _, entry in self.pending[:count]]
        self.pending = self.pending[count:]
        self.released += len(ready)
        return ready

    def finish(self, final: Sequence[TokenLogprob] | None) -> list[TokenLogprob] | None:
        return None if final is None else list(final[self.released:])
