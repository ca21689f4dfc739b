"""Routes: typed adapters that parse, call the backend, and convert.

Tokenizing (and adding to the index) runs on a worker thread (`run_in_threadpool`): a
megabyte of text takes ~0.2 s, and the event loop keeps answering /health and the
streams meanwhile.

OpenAI: POST /v1/completions (`suffix` makes it FIM), POST /v1/chat/completions
(chat.py: tools, response_format), GET /v1/models; both take `prediction`; codespec's
POST /v1/next_edit (next_edit.py); llama.cpp:
POST /infill; operations: GET /health, GET /metrics; the index: POST
/v1/index/documents, DELETE /v1/index/documents/{key}, GET /v1/index/stats; the
language server's telemetry, POST /v1/lsp/acceptance, and its idle-time hints, POST
/v1/lsp/prefill. Streaming responses are server-sent events ending with `data: [DONE]`.
"""

from __future__ import annotations

import os
import threading
import uuid
from pathlib import Path
from typing import Any, Callable

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.concurrency import run_in_threadpool

from codespec import prompts
from codespec.engine.run import Generation, GenerationConfig
from codespec.engine.textstream import settled_end
from codespec.errors import RequestError
from codespec.index import SuffixIndex
from codespec.landing.cut import Landing, infill_mode
from codespec.landing.syntax import Mode
from codespec.landing.lines import HeldSpace
from codespec.server import chat, next_edit
from codespec.server.logprobs import CompletionLogprobs
from codespec.server.responses import (AnyBackend, Envelope, alternatives, backend, check_model, stream, streaming,
                                       unless_client_leaves, predicted)
from codespec.server.upstream_backend import UpstreamBackend
from codespec.server.schemas import (
    AcceptanceRequest,
    CompletionRequest,
    DocumentRequest,
    InfillRequest,
    PrefillRequest,
    WorkspaceRequest,
    error_body,
)

router = APIRouter()
router.include_router(chat.router)
router.include_router(next_edit.router)


@router.post("/v1/completions")
async def completions(req: CompletionRequest, request: Request, b: AnyBackend = Depends(backend)) -> Any:
    check_model(b, req.model)
    b.check_prompt_size(req.prompt_text if req.prompt_ids is None else "", req.suffix or "")
    if req.prompt_ids is not None:  # the model's own tokens, as sent
        if req.suffix is not None:
            raise RequestError("suffix needs a text prompt; send token ids without a suffix")
        ids = req.prompt_ids
    elif req.suffix is not None:
        ids = await run_in_threadpool(prompts.fim_ids, b.tokenizer, req.prompt_text, req.suffix)
    else:  # verbatim, like `codespec generate`: special tokens written in it are recognised
        ids = await run_in_threadpool(prompts.encode_prompt, b.tokenizer, req.prompt_text)
    prediction = await predicted(b, req.prediction)
    b.check_request(ids, req.max_tokens, prediction)
    fim: dict[str, Any] = {}
    if req.suffix is not None:  # a fill-in-the-middle ends where it meets the suffix, and at the FIM tokens
        meeting = Landing.meeting(req.prompt_text + req.suffix, len(req.prompt_text))
        fim = {"end_at": meeting.end, "end_ids": prompts.fim_end_ids(b.tokenizer)}
    config = GenerationConfig(max_new_tokens=req.max_tokens, stop=tuple(req.stop), temperature=req.temperature,
                              top_p=req.top_p, seed=req.seed, logprobs=alternatives(b, req.alternatives),
                              prediction=prediction, **fim)
    envelope = Envelope(f"cmpl-{uuid.uuid4().hex}", b.name, prediction)
    shown = CompletionLogprobs(b.token_text) if config.logprobs is not None else None

    def chunk(text: str, done: Generation | None, logprobs: Any) -> dict[str, Any]:
        return envelope("text_completion", {"text": text, "logprobs": shown(logprobs) if shown else None}, done)

    if req.stream:
        return streaming(stream(b, ids, config, chunk))
    g = await unless_client_leaves(request, b.complete(ids, config))
    return chunk(g.text, g, g.logprobs) if isinstance(g, Generation) else g


@router.post("/infill")
async def infill(req: InfillRequest, request: Request, b: AnyBackend = Depends(backend)) -> Any:
    """llama.cpp's /infill: FIM with the tokenizer's FIM and repository tokens. Greedy
    unless the request sets a temperature (then top_k / top_p apply). The prompt's
    KV is reused by the prefix cache (`tokens_cached`).

    Spaces or tabs that end `prompt` (the typed part of the line), or `input_prefix` when
    there is no `prompt`, are held back from the model and the content starts after
    them: a prompt ending in a space puts a token boundary where the tokenizer never has
    one, and the model answers with one space too many (`HeldSpace`).

    The content is cut for where it lands, as the language server cuts its suggestions
    (landing/cut.py): one line when text follows the cursor on its line, else the block
    enclosing the cursor, ending where it meets the suffix's first code line; no trailing
    blank lines, nothing when only whitespace is left. The generation stops there, and at
    the model's FIM tokens."""
    b.check_prompt_size(req.input_prefix, req.prompt, req.input_suffix, *(c.text for c in req.input_extra))
    ids, held, landing, ends = await run_in_threadpool(_infill_ids, b, req)
    if req.n_predict < 0:  # "no limit": the server's, as llama-server's --n-predict
        limit = min(b.settings.infill_max_tokens, b.settings.max_tokens_limit)
    else:
        limit = max(req.n_predict, 1)
    b.check_request(ids, limit)
    seconds = req.t_max_predict_ms / 1000 if req.t_max_predict_ms else None
    config = GenerationConfig(max_new_tokens=limit, stop=tuple(req.stop), time_limit_s=seconds, time_limit_llama=True,
                              temperature=req.temperature or 0.0, top_p=req.top_p, top_k=req.top_k, seed=req.seed,
                              min_indent=req.n_indent, end_at=healed_end(held, landing), end_ids=ends)
    healed = Healed(held, landing)

    def chunk(text: str, done: Generation | None, _logprobs: Any = None) -> dict[str, Any]:
        # n_predict 0 (llama.vim's ring-buffer warm-up) only fills the KV cache: one token is
        # generated, as the engine always does, and not returned
        content = (healed.finish(done.text) if done else healed(text)) if req.n_predict else ""
        out: dict[str, Any] = {"content": content, "stop": done is not None}
        if done:
            s = done.stats
            stop_type = "limit" if done.finish_reason == "length" else ("word" if req.stop else "eos")
            out |= {"model": b.name, "tokens_predicted": s.generated_tokens, "tokens_evaluated": s.prompt_tokens,
                    "tokens_cached": s.cached_prompt_tokens, "truncated": False, "stop_type": stop_type,
                    "timings": _timings(s), "codespec": s.to_json()}
        return _fields(out, req.response_fields)

    if req.stream:
        return streaming(stream(b, ids, config, chunk, done_marker=False))
    g = await unless_client_leaves(request, b.complete(ids, config))
    return chunk(g.text, g) if isinstance(g, Generation) else g


def _infill_ids(b: AnyBackend, req: InfillRequest) -> tuple[list[int], HeldSpace, Landing, frozenset[int]]:
    """An /infill request's prompt, the spaces held back from its middle, where its
    content lands, and the tokens that end it."""
    extra = [prompts.ExtraFile(c.filename, c.text) for c in req.input_extra]
    prefix, middle = req.input_prefix, req.prompt
    if req.anchor_prefix:
        prefix = prompts.anchored_prefix(prefix)
    typed = req.input_prefix + req.prompt  # the document up to the cursor, as far as it was sent
    if middle:
        middle, held = HeldSpace.split(middle)
    else:  # no typed part: the cursor is at the prefix's end (agents send this), whose spaces are held
        prefix, held = HeldSpace.split(prefix)
    layout = req.fim_layout or b.settings.infill_layout
    ids = prompts.fim_ids(b.tokenizer, prefix, req.input_suffix, middle, extra, layout=layout)
    document = typed + req.input_suffix
    landing = Landing.at(document, len(typed), "", infill_mode(document, len(typed)))
    return ids, held, landing, prompts.fim_end_ids(b.tokenizer)


def healed_end(held: HeldSpace, landing: Landing) -> Callable[[str], tuple[int, int] | None]:
    """`landing.end` over the model's raw output, which starts with the held-back spaces:
    positions in the raw text. Output that writes other whitespace there ends at once."""

    def end_at(raw: str) -> tuple[int, int] | None:
        healed = held.heal(raw)
        if healed is None:  # it disagrees with the cursor: known at the first differing character
            return 0, len(os.path.commonprefix([raw, held.text])) + 1
        if len(raw) <= len(held.text):
            return None
        end = landing.end(healed)
        return None if end is None else (end[0] + len(held.text), end[1] + len(held.text))

    return end_at

@router.post("/v1/lsp/prefill")
async def lsp_prefill(req: PrefillRequest, b: AnyBackend = Depends(backend)) -> dict[str, Any]:
    """`codespec lsp --server` and `--shared`: the /infill prompt the editor will most
    likely send next (lsp/ahead.py); the scheduler computes its whole chunks while no
    request runs, and a request pre-empts that work (Scheduler.prefill_ahead)."""
    if isinstance(b, UpstreamBackend):
        return {"ok": False, "reason": f"{b.name} prefills in the engine behind this server"}
    if req.forget:
        b.scheduler.prefill_ahead(req.key, None)
        return {"ok": True, "tokens": 0}
    ids = (await run_in_threadpool(_infill_ids, b, req))[0]
    if len(ids) >= b.engine.context_limit:
        return {"ok": False, "reason": f"the prompt has {len(ids)} tokens; this server holds {b.engine.context_limit}"}
    b.scheduler.prefill_ahead(req.key, ids)
    return {"ok": True, "tokens": len(ids)}


class Healed:
    """A stream's content, piece by piece: the text after the whitespace held back from
    its prompt (`HeldSpace`; nothing while the model writes that whitespace, nothing at all
    if it writes something else there), in whole lines as the cut allows them, and at the
    end the rest of the content as `Landing.trim` leaves it: what went out is always a
    start of the final content, whichever backend streams."""

    def __init__(self, held: HeldSpace, landing: Landing) -> None:
        self.held, self.landing, self.raw, self.sent = held, landing, "", 0

    def __call__(self, piece: str) -> str:
        """What of the content is certain after `piece`: whole lines, short of where the
        output ends and of trailing whitespace (one line comes whole, at the end)."""
        self.raw += piece
        if self.landing.mode is not Mode.MULTI:
            return ""
        text = self.held.heal(self.raw) or ""
        return self._send(text[: settled_end(text, self.landing.end)])

    def finish(self, final_raw: str) -> str:
        return self._send(self.landing.trim(self.held.heal(final_raw) or ""))

    def _send(self, text: str) -> str:
        if len(text) <= self.sent:
            return ""
        out = text[self.sent :]
        self.sent += len(out)
        return out


def _timings(s: Any) -> dict[str, float]:
    """llama.cpp's `timings`: prompt_n counts the prompt tokens evaluated (not cached)."""
    prompt_n = s.prompt_tokens - s.cached_prompt_tokens
    prompt_ms, predicted_ms = s.ttft_s * 1000, max(s.wall_s - s.ttft_s, 0.0) * 1000
    return {"prompt_n": prompt_n, "prompt_ms": prompt_ms,
            "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
            "prompt_per_second": 1000 * prompt_n / prompt_ms if prompt_ms else 0.0,
            "predicted_n": s.generated_tokens, "predicted_ms": predicted_ms,
            "predicted_per_token_ms": predicted_ms / s.generated_tokens if s.generated_tokens else 0.0,
            "predicted_per_second": 1000 * s.generated_tokens / predicted_ms if predicted_ms else 0.0}


def _fields(out: dict[str, Any], fields: list[str] | None) -> dict[str, Any]:
    """llama.cpp's `response_fields`: only those fields, a nested one (`timings/prompt_n`)
    moved to the top under its path; a missing one is left out."""
    if not fields:
        return out
    picked: dict[str, Any] = {}
    for name in fields:
        value: Any = out
        for key in name.split("/"):
            value = value.get(key, _MISSING) if isinstance(value, dict) else _MISSING
        if value is not _MISSING:
            picked[name] = value
    return picked


_MISSING = object()


@router.get("/v1/models")
async def models(b: AnyBackend = Depends(backend)) -> dict[str, Any]:
    return {"object": "list", "data": [{"id": b.name, "object": "model", "created": 0, "owned_by": "codespec"}]}


@router.post("/v1/lsp/acceptance")
async def lsp_acceptance(req: AcceptanceRequest, b: AnyBackend = Depends(backend)) -> dict[str, Any]:
    """Telemetry from `codespec lsp --server`: a completion was shown, or accepted."""
    b.metrics.lsp_completions.labels("accepted" if req.accepted else "shown").inc()
    return {"ok": True}


@router.get("/health")
async def health(b: AnyBackend = Depends(backend)) -> dict[str, Any]:
    return b.health()


@router.get("/metrics")
async def metrics(b: AnyBackend = Depends(backend)) -> Response:
    b.refresh_gauges()
    return Response(generate_latest(b.metrics.registry), media_type=CONTENT_TYPE_LATEST)


def _index(b: AnyBackend) -> SuffixIndex:
    if b.index is None:
        raise RequestError(f"this server has no index: {b.name} generates (and drafts) in the engine behind it; "
                           "give that engine the index (docs/scale.md)")
    return b.index


@router.post("/v1/index/documents")
async def add_document(req: DocumentRequest, b: AnyBackend = Depends(backend)) -> dict[str, Any]:
    """Add or replace a document (an open buffer, a file the client edited) in the
    dynamic index; later drafts can copy from it."""
    index = _index(b)
    ids = await run_in_threadpool(prompts.encode, b.tokenizer, req.text)
    await run_in_threadpool(index.add_document, req.key, ids)
    return {"key": req.key, "tokens": len(ids)}


# one build at a time, a second window waiting for the first; a thread lock, since the
# build runs on the thread pool and an app may outlive one event loop (tests)
_workspace_lock = threading.Lock()


@router.post("/v1/index/workspace")
async def index_workspace(req: WorkspaceRequest, b: AnyBackend = Depends(backend)) -> Any:
    """Index a local folder (as `--repo` does at start-up) and make it the static index:
    the language servers sharing one server send their workspace. Off unless the server
    runs with `index_workspaces` (`codespec lsp --shared` starts it so): a server that
    reads any folder a client names must be one only its user can reach."""
    from codespec.indexing import build_static_index

    if not b.settings.index_workspaces:
        return JSONResponse(error_body("this server does not index folders for clients (index_workspaces is off)",
                                       code="forbidden"), status_code=403)
    index = _index(b)
    root = Path(req.root)
    if not root.is_absolute() or not root.is_dir():
        raise RequestError(f"root {req.root!r}: give the absolute path of a local folder")
    if not os.access(root, os.R_OK | os.X_OK):
        raise RequestError(f"root {req.root!r}: this server may not read that folder")

    def build() -> Any:
        with _workspace_lock:  # the swap too: the last folder asked for is the one served
            report, index.static = build_static_index(root, b.tokenizer, b.settings.cache_dir,
                                                      max_total_bytes=b.settings.index_max_mb << 20)
            return report

    report = await run_in_threadpool(build)
    return {"root": str(root), "files": report.files, "tokens": report.tokens, "capped": report.skipped.over_cap}


@router.delete("/v1/index/documents/{key:path}")
async def remove_document(key: str, b: AnyBackend = Depends(backend)) -> Any:
    if not _index(b).remove_document(key):
        return JSONResponse(error_body(f"no document {key!r} in the index", code="not_found"), status_code=404)
    return {"key": key, "removed": True}


@router.get("/v1/index/stats")
async def index_stats(b: AnyBackend = Depends(backend)) -> dict[str, Any]:
    if b.index is None:
        return {"static": None, "dynamic": None, "upstream": b.health().get("upstream")}
    return b.index.stats()
