"""What the OpenAI-style routes share: the backend, the response envelope and usage,
server-sent event streams, and answers that stop when their client leaves."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any, AsyncIterator, Awaitable, Callable

from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from codespec import prompts
from codespec.engine.run import Generation, GenerationConfig
from codespec.errors import RequestError
from codespec.index.prediction import prediction_usage
from codespec.server.backend import Backend, GenerationFailed, ShuttingDown
from codespec.server.schemas import error_body
from codespec.server.upstream_backend import UpstreamBackend

log = logging.getLogger("codespec.server")


AnyBackend = Backend | UpstreamBackend  # the model here, or an engine behind (serve --upstream)


def backend(request: Request) -> AnyBackend:
    return request.app.state.backend


class ModelNotFound(RequestError):
    pass


def check_model(b: AnyBackend, model: str | None) -> None:
    if model and model not in b.model_names():
        raise ModelNotFound(f"the model {model!r} does not exist here; GET /v1/models lists {b.name!r}")


def alternatives(b: AnyBackend, asked: int | None) -> int | None:
    """The request's logprobs setting; an engine behind `--upstream` is not asked for them."""
    if asked is not None and isinstance(b, UpstreamBackend):
        raise RequestError("logprobs are not served through --upstream; ask the engine behind it directly")
    return asked


def usage(g: Generation, prediction: tuple[int, ...] = ()) -> dict[str, Any]:
    """OpenAI's usage; with a prediction, how many of its tokens the output has
    (`accepted_prediction_tokens`) and has not (`rejected_prediction_tokens`)."""
    s = g.stats
    out: dict[str, Any] = {"prompt_tokens": s.prompt_tokens, "completion_tokens": s.generated_tokens,
                           "total_tokens": s.prompt_tokens + s.generated_tokens}
    if prediction:
        accepted, rejected = prediction_usage(prediction, g.token_ids)
        out["completion_tokens_details"] = {"reasoning_tokens": 0, "accepted_prediction_tokens": accepted,
                                            "rejected_prediction_tokens": rejected}
    return out


class Envelope:
    """OpenAI's response shape around one choice; the final one carries usage and
    codespec's speculation stats."""

    def __init__(self, response_id: str, model: str, prediction: tuple[int, ...] = ()) -> None:
        self.id, self.model, self.created = response_id, model, int(time.time())
        self.prediction = prediction

    def __call__(self, kind: str, choice: dict[str, Any], done: Generation | None,
                 finish: str | None = None) -> dict[str, Any]:
        """`finish`: the finish_reason when it is not the generation's (tool calls)."""
        reason = (finish or done.finish_reason) if done else None
        out: dict[str, Any] = {"id": self.id, "object": kind, "created": self.created, "model": self.model,
                               "choices": [{"index": 0, **choice, "finish_reason": reason}]}
        if done:
            out["usage"] = usage(done, self.prediction)
            out["codespec"] = done.stats.to_json()
        return out


def sse(payload: dict[str, Any] | str) -> str:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n"


async def stream(b: AnyBackend, prompt_ids: list[int], config: GenerationConfig,
                  chunk: Callable[[str, Generation | None, Any], dict[str, Any]],
                  done_marker: bool = True) -> AsyncIterator[str]:
    try:
        async for piece, done, logprobs in b.stream_text(prompt_ids, config):
            yield sse(chunk(piece, done, logprobs))
    except RequestError as exc:  # the request failed after the headers: say so in the stream
        yield sse(error_body(str(exc)))
    except GenerationFailed as exc:  # an engine failure ends this stream only
        yield sse(error_body(str(exc), kind="server_error"))
    except ShuttingDown as exc:  # the server stops: the stream ends with a reason, not a cut
        yield sse(error_body(str(exc), kind="server_error", code="server_shutting_down"))
    except Exception as exc:  # a fault after the headers (a chunk's conversion): still an event and the end
        log.warning("a stream failed after its headers: %s: %s", type(exc).__name__, exc, exc_info=True)
        yield sse(error_body(f"the request failed: {type(exc).__name__}: {exc}", kind="server_error"))
    if done_marker:
        yield sse("[DONE]")


CLIENT_LEFT = 499  # nginx's "client closed request": counted in /metrics, sent to no one


async def unless_client_leaves(request: Request, work: Awaitable[Any]) -> Any:
    """A non-streaming answer that stops when its client disconnects: the request is
    cancelled (its slot freed at the next step), not generated to its end for no one."""
    task = asyncio.ensure_future(work)

    async def client_left() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(client_left())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)  # the request's own clean-up (ticket.cancel) runs
        return Response(status_code=CLIENT_LEFT)
    finally:
        task.cancel()
        watcher.cancel()


def streaming(body: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(body, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def predicted(b: AnyBackend, prediction: Any) -> tuple[int, ...]:
    """A request's `prediction` as tokens (plain text: no marker in it is a token)."""
    if prediction is None:
        return ()
    text = prediction.text()
    b.check_prompt_size(text, what="the prediction")
    return tuple(await run_in_threadpool(prompts.encode, b.tokenizer, text))
