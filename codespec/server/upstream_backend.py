"""`codespec serve --upstream URL`: codespec's routes in front, another engine behind.

The front keeps what codespec adds for editors and agents: llama.cpp's `/infill` and
OpenAI's routes with FIM prompts built from the model's own tokens, the API key, body
limits, OpenAI-style errors, Prometheus metrics and the language server's telemetry.
Generation (and drafting: codespec's vLLM proposer, SGLang's n-gram corpus) runs in the
engine at `URL` (vLLM, SGLang, llama.cpp, or another codespec serve), which gets the
prompt as token ids. No model loads here: only its tokenizer.

Not forwarded: `time_limit_s` (`t_max_predict_ms`); the index routes answer that the
index lives in the engine.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Sequence

from codespec.engine.run import Generation, GenerationConfig
from codespec.errors import RequestError
from codespec.integrations.upstream import Delta, ServedModel, UpstreamClient, UpstreamError
from codespec.engine.scheduler import SchedulerFull
from codespec.server.backend import Chunk, Draining, GenerationFailed, Served, ShuttingDown, check_limits
from codespec.server.metrics import Metrics
from codespec.settings import Settings
from codespec.engine.stats import GenerationStats


@dataclass
class UpstreamBackend(Served):
    name: str  # the engine's model, as its /v1/models lists it
    tokenizer: Any
    client: UpstreamClient
    served: ServedModel
    settings: Settings
    metrics: Metrics = field(default_factory=Metrics)
    index: None = None  # drafts come from the engine's own index
    active: int = 0
    draining: Draining = field(default_factory=Draining)

    @classmethod
    def connect(cls, url: str, tokenizer: Any, settings: Settings, api_key: str = "") -> UpstreamBackend:
        """Reach the engine, learn its model and check that its tokenizer is ours."""
        client = UpstreamClient(url, api_key)
        served = client.served_model()
        client.check_tokenizer(served.name, tokenizer)
        return cls(served.name, tokenizer, client, served, settings)

    def close(self) -> None:
        return None

    def context_tokens(self) -> int | None:
        return self.served.max_model_len

    def check_request(self, prompt_ids: Sequence[int], max_tokens: int, prediction: Sequence[int] = ()) -> None:
        """`prediction` is not sent on: the engine behind drafts as it does (usage still
        counts the prediction's tokens in the output)."""
        check_limits(prompt_ids, max_tokens, self.settings)
        limit = self.served.max_model_len
        if limit is not None and len(prompt_ids) >= limit:
            raise RequestError(f"the prompt has {len(prompt_ids)} tokens; the engine's context holds {limit}")
        if self.active >= self.settings.max_active_requests + self.settings.max_waiting_requests:
            raise SchedulerFull(f"{self.active} requests are in flight to the engine; retry shortly")

    def _body(self, prompt_ids: Sequence[int], config: GenerationConfig) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.name, "prompt": list(prompt_ids), "max_tokens": config.max_new_tokens,
                                "temperature": config.temperature, "top_p": config.top_p}
        if config.stop:
            body["stop"] = list(config.stop)
        if config.top_k:
            body["top_k"] = config.top_k
        if config.seed is not None:
            body["seed"] = config.seed
        return body

    async def stream_text(self, prompt_ids: Sequence[int], config: GenerationConfig) -> AsyncIterator[Chunk]:
        """The engine's text as it streams, then the finished Generation (its token ids
        are not streamed back: `token_ids` is empty, usage comes from the engine)."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Delta | BaseException | None] = asyncio.Queue()
        stop = threading.Event()
        body = self._body(prompt_ids, config)

        def run() -> None:  # a worker thread: urllib blocks
            try:
                for delta in self.client.stream(body, stop):
                    loop.call_soon_threadsafe(queue.put_nowait, delta)
                loop.call_soon_threadsafe(queue.put_nowait, None)
            except BaseException as exc:  # noqa: BLE001 - handed to the request
                loop.call_soon_threadsafe(queue.put_nowait, exc)

        started = time.perf_counter()
        stats = GenerationStats(prompt_tokens=len(prompt_ids))
        text, finish = "", None
        self.active += 1
        self.metrics.active.set(self.active)
        threading.Thread(target=run, daemon=True, name="codespec-upstream").start()
        try:
            with self.draining.track(queue):
                while (item := await queue.get()) is not None:
                    if isinstance(item, ShuttingDown):
                        raise item
                    if isinstance(item, BaseException):
                        raise _request_error(item)
                    if item.text and not text:
                        stats.ttft_s = time.perf_counter() - started
                    text += item.text
                    finish = item.finish_reason or finish
                    if item.usage:
                        stats.prompt_tokens = item.usage.get("prompt_tokens", stats.prompt_tokens)
                        stats.generated_tokens = item.usage.get("completion_tokens", 0)
                    if item.text:
                        yield item.text, None, None
        finally:
            stop.set()  # a client that left stops the read: the engine sees the disconnect
            self.active -= 1
            self.metrics.active.set(self.active)
        stats.wall_s = time.perf_counter() - started
        self.metrics.observe(stats)
        yield "", Generation([], text, "length" if finish == "length" else "stop", stats), None

    async def complete(self, prompt_ids: Sequence[int], config: GenerationConfig) -> Generation:
        result = None
        async for _, done, _ in self.stream_text(prompt_ids, config):
            result = done or result
        assert result is not None
        return result

    def health(self) -> dict[str, Any]:
        return {"status": "ok", "model": self.name, "upstream": self.client.url, "active": self.active,
                "settings": self.settings.effective()}

    def refresh_gauges(self) -> None:
        self.metrics.active.set(self.active)


def _request_error(exc: BaseException) -> Exception:
    """The engine refusing the request (4xx) is the client's error; anything else is ours."""
    if isinstance(exc, UpstreamError) and exc.status is not None and 400 <= exc.status < 500:
        return RequestError(f"the engine refused the request: {exc}")
    return GenerationFailed(f"the engine failed: {exc}")
