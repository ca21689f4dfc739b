"""What the routes share: the model, the scheduler, the index, the metrics; and the
bridge from the scheduler's worker thread to an async route.

Generation never runs on the event loop: the scheduler's thread steps the runs and hands
committed tokens to the loop with `call_soon_threadsafe`. A route that stops listening
(the client went away) cancels its ticket, which frees the slot at the next step.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Iterator, Sequence

from codespec.engine.engine import Engine, Generation, GenerationConfig
from codespec.verify.logprobs import TokenLogprob
from codespec.engine.scheduler import Scheduler, start_scheduler
from codespec.engine.textstream import TextStream
from codespec.errors import CodespecError, RequestError
from codespec.forward.select import Loaded
from codespec.index import SuffixIndex
from codespec.server.logprobs import Release, TokenText
from codespec.server.metrics import Metrics
from codespec.settings import Settings

log = logging.getLogger("codespec.server")

# text to send now; the finished generation, last; the logprobs of the tokens behind the
# text (None unless the request asked for them)
Chunk = tuple[str, Generation | None, list[TokenLogprob] | None]


class GenerationFailed(CodespecError):
    """The engine failed on this request (the server answers 500 and keeps serving)."""


class ShuttingDown(CodespecError):
    """The server is stopping: an open request ends with this error (503, or an error
    event in a stream) instead of being cut, and a new one is refused."""


class Draining:
    """The open requests' queues, so that a stopping server can end each one cleanly."""

    def __init__(self) -> None:
        self.closing = False
        self.queues: set[asyncio.Queue[Any]] = set()

    @contextmanager
    def track(self, queue: asyncio.Queue[Any]) -> Iterator[None]:
        if self.closing:
            raise ShuttingDown("the server is shutting down; send the request again once it is back")
        self.queues.add(queue)
        try:
            yield
        finally:
            self.queues.discard(queue)

    def drain(self) -> None:
        """On the event loop's thread: every open request ends with ShuttingDown."""
        self.closing = True
        for queue in list(self.queues):
            queue.put_nowait(ShuttingDown("the server is shutting down; this request was stopped before its end"))


class Served:
    """What every backend does the same way: its names, and ending its open requests.
    A subclass holds `name` and `draining`."""

    name: str
    draining: Draining

    def drain(self) -> None:
        self.draining.drain()

    def model_names(self) -> set[str]:
        return served_names(self.name)

    def context_tokens(self) -> int | None:
        """The most tokens a prompt may have here (None: not known)."""
        return None

    def check_prompt_size(self, *texts: str, what: str = "the prompt") -> None:
        """Refuse, before tokenizing, text that cannot fit the context whatever its tokens:
        no token is longer than the vocabulary's longest entry, so it holds at least
        characters / that many tokens. (Tokenizing 8 MB takes ~15 s on a 2-core CPU.)"""
        limit = self.context_tokens()
        chars = sum(len(t) for t in texts)
        if limit is None or not chars:
            return
        longest = longest_token_chars(self.tokenizer)  # type: ignore[attr-defined]
        if chars > limit * longest:
            raise RequestError(f"{what} has {chars} characters, at least {chars // longest} tokens; this "
                               f"server's context holds {limit}")


@dataclass
class Backend(Served):
    name: str  # the served model's name, as /v1/models lists it
    tokenizer: Any
    engine: Engine
    scheduler: Scheduler
    index: SuffixIndex
    settings: Settings
    metrics: Metrics = field(default_factory=Metrics)
    forward: dict[str, Any] = field(default_factory=dict)  # the backend select.py chose, and why
    draining: Draining = field(default_factory=Draining)
    token_text: TokenText = field(init=False)  # token ids as logprobs show them

    def __post_init__(self) -> None:
        self.token_text = TokenText(self.tokenizer)

    @classmethod
    def create(cls, loaded: Loaded, settings: Settings, index: SuffixIndex) -> Backend:
        """A backend over a model already loaded (tests share one across apps)."""
        scheduler, _ = start_scheduler(settings, index, lambda: loaded)
        return cls(loaded.name, loaded.tokenizer, scheduler.engine, scheduler, index, settings,
                   forward=loaded.info()["forward"])

    def close(self) -> None:
        self.scheduler.close()

    def context_tokens(self) -> int | None:
        return self.engine.context_limit

    def check_request(self, prompt_ids: Sequence[int], max_tokens: int, prediction: Sequence[int] = ()) -> None:
        """Refuse what cannot be served before any header is sent."""
        check_limits(prompt_ids, max_tokens, self.settings)
        self.engine.check_prompt(prompt_ids)
        self.engine.check_prediction(prompt_ids, prediction)

    async def stream_text(self, prompt_ids: Sequence[int], config: GenerationConfig) -> AsyncIterator[Chunk]:
        """Text as it becomes safe to show (whole characters, no partial stop string),
        then the rest with the finished Generation."""
        text = TextStream(self.engine.decode, config.stop, config.min_indent, config.end_at)
        release = Release(self.engine.decode) if config.logprobs is not None else None
        async for item in self.generate(prompt_ids, config):
            if isinstance(item, Generation):
                yield text.finish(item.text), item, release.finish(item.logprobs) if release else None
            else:
                piece = text.push(item)
                entries = release.push(getattr(item, "logprobs", None) or (), text.sent) if release else None
                if piece or entries:
                    yield piece, None, entries

    async def complete(self, prompt_ids: Sequence[int], config: GenerationConfig) -> Generation:
        result = None
        async for item in self.generate(prompt_ids, config):
            if isinstance(item, Generation):
                result = item
        assert result is not None
        return result

    def health(self) -> dict[str, Any]:
        cache = self.engine.cache
        return {"status": "ok", "model": self.name, "active": self.scheduler.active,
                "waiting": self.scheduler.queue_depth, "draft_policy": self.engine.draft_policy,
                "kv_cache": {"slots": cache.slots, "free_slots": cache.free_slots, "slot_tokens": cache.slot_tokens},
                "index": index_summary(self.index),
                # which backend runs the passes, why, and whether this process ever imported torch
                "forward": {**self.forward, "torch_imported": "torch" in sys.modules},
                "settings": self.settings.effective()}

    def refresh_gauges(self) -> None:
        self.metrics.degraded.set(1 if self.forward.get("degraded") else 0)
        summary = index_summary(self.index)
        self.metrics.index_tokens.labels("static").set(summary["static_tokens"])
        self.metrics.index_tokens.labels("dynamic").set(summary["dynamic_tokens"])
        self.metrics.queue_depth.set(self.scheduler.queue_depth)
        self.metrics.active.set(self.scheduler.active)

    async def generate(self, prompt_ids: Sequence[int], config: GenerationConfig) -> AsyncIterator[list[int] | Generation]:
        """Committed token lists as they come, then the finished Generation. Raises the
        request's own error; cancelling the iteration cancels the request."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[list[int] | Generation | BaseException] = asyncio.Queue()
        put = queue.put_nowait
        with self.draining.track(queue):
            ticket = self.scheduler.submit(
                prompt_ids, config,
                on_tokens=lambda tokens: loop.call_soon_threadsafe(put, tokens),
                on_done=lambda outcome: loop.call_soon_threadsafe(put, outcome),
            )
            self.metrics.queue_depth.set(self.scheduler.queue_depth)
            try:
                while True:
                    item = await queue.get()
                    if isinstance(item, CodespecError):
                        raise item
                    if isinstance(item, BaseException):
                        raise GenerationFailed(f"generation failed: {type(item).__name__}: {item}") from item
                    yield item
                    if isinstance(item, Generation):
                        self.metrics.observe(item.stats)
                        return
            finally:
                ticket.cancel()  # a no-op when finished; frees the slot when the client left
                self.metrics.queue_depth.set(self.scheduler.queue_depth)


@functools.lru_cache(maxsize=8)  # one per served tokenizer
def longest_token_chars(tokenizer: Any) -> int:
    """The most characters one token of `tokenizer` stands for (a byte-level entry has a
    character per byte, and a byte is at most a character)."""
    return max((len(entry) for entry in tokenizer.get_vocab()), default=1)


def served_names(name: str) -> set[str]:
    """The model names a request may ask for: the served name, its last path part, and
    "codespec"."""
    return {name, "codespec", Path(name).name}


def check_limits(prompt_ids: Sequence[int], max_tokens: int, settings: Settings) -> None:
    """What every backend refuses: an empty prompt, a token limit above the server's."""
    if not prompt_ids:
        raise RequestError("the prompt is empty")
    if max_tokens > settings.max_tokens_limit:
        raise RequestError(f"max_tokens {max_tokens} is above this server's limit of {settings.max_tokens_limit}")


def index_summary(index: SuffixIndex) -> dict[str, Any]:
    stats = index.stats()
    static = stats.get("static") or {}
    return {"static_tokens": static.get("tokens", 0), "files": static.get("files", 0),
            "dynamic_tokens": stats["dynamic"]["live_tokens"], "rebuild_error": str(index.rebuild_error or "")}
