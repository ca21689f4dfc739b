"""The FastAPI app: built by `create_app`, model and index loaded in `lifespan`.

    app = create_app(Settings())                  # loads the model at start-up
    app = create_app(settings, backend=backend)   # tests: a backend already built

Every error is an OpenAI-style body (`{"error": {"message", "type", "param", "code"}}`)
with a 4xx status for the client's mistakes; a request that fails inside the engine
fails alone and the server keeps serving.
"""

from __future__ import annotations

import hmac
import logging
import sys
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from codespec import __version__
from codespec.errors import CodespecError, RequestError
from codespec.index import SuffixIndex
from codespec.engine.scheduler import SchedulerFull
from codespec.engine.scheduler import start_scheduler
from codespec.server.backend import Backend, GenerationFailed, ShuttingDown
from codespec.server.http import TIMED_OUT
from codespec.server.responses import ModelNotFound
from codespec.server.routes import router
from codespec.server.upstream_backend import UpstreamBackend
from codespec.server.schemas import error_body
from codespec.settings import Settings

log = logging.getLogger("codespec.server")
UNAUTHENTICATED = frozenset({"/health"})


def create_app(settings: Settings, backend: Backend | UpstreamBackend | None = None) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.backend = backend if backend is not None else load_backend(settings)
        try:
            yield
        finally:
            if backend is None:  # what we built, we close; an injected backend belongs to its owner
                app.state.backend.close()

    app = FastAPI(title="codespec", version=__version__, lifespan=lifespan)
    app.state.settings = settings
    if backend is not None:  # in-process test clients do not run the lifespan
        app.state.backend = backend
    app.include_router(router)
    _install_error_handlers(app)

    app.add_middleware(_BodyLimit, limit=settings.max_request_bytes)
    if settings.api_key:
        app.add_middleware(_BearerAuth, key=settings.api_key)
    app.add_middleware(_Counted)  # the last added runs first: it sees every answer, 401 and 413 included
    return app


def load_backend(settings: Settings) -> Backend | UpstreamBackend:
    """The model, and the index: a file (`index`), or the repository (`repo`) indexed in
    the background while the server already answers. The model loads on the
    scheduler's thread, where every step runs (scheduler.py: one torch thread pool).
    With `upstream`, only the tokenizer: the engine there generates."""
    if settings.upstream:
        from codespec.models.loading import load_tokenizer

        if settings.index:
            raise CodespecError("--index with --upstream: the engine drafts from its own index; give it the file "
                                "(CODESPEC_INDEX for vLLM's codespec proposer, docs/scale.md)")
        tokenizer = load_tokenizer(settings, progress=False)
        return UpstreamBackend.connect(settings.upstream, tokenizer, settings, settings.upstream_api_key)
    from codespec.forward import select as forward
    from codespec.indexing import build_static_index, default_index_path, tokenizer_fingerprint

    index = SuffixIndex.load(settings.index) if settings.index else SuffixIndex()
    root = Path(settings.repo).resolve() if settings.repo and not settings.index else None
    if root is not None and not root.is_dir():
        raise CodespecError(f"--repo {settings.repo}: not a directory")

    def load() -> forward.Loaded:
        loaded = forward.load(settings)
        if settings.index:
            index.check_tokenizer(tokenizer_fingerprint(loaded.tokenizer))
        return loaded

    scheduler, loaded = start_scheduler(settings, index, load)
    if root is not None:
        # Only now, with the engine calibrated: an index build beside the timed passes held
        # one of the cores and made them ~2x slower (they ran 50% of their time).
        def rebuild() -> Any:
            return build_static_index(root, loaded.tokenizer, settings.cache_dir,
                                      max_total_bytes=settings.index_max_mb << 20)[1]

        out = default_index_path(settings.cache_dir, root)
        print(f"codespec: indexing {root} in the background -> {out}", file=sys.stderr)
        index.rebuild_in_background(rebuild)
    return Backend(loaded.name, loaded.tokenizer, scheduler.engine, scheduler, index, settings,
                   forward=loaded.info()["forward"])


def _install_error_handlers(app: FastAPI) -> None:
    def reply(status: int, message: str, kind: str = "invalid_request_error", param: str | None = None,
              code: str | None = None) -> JSONResponse:
        return JSONResponse(error_body(message, kind, param, code), status_code=status)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        message = first.get("msg", "invalid request")
        if first.get("type") == "json_invalid":
            # its loc is ("body", the character offset), not a field: say where and why
            why = (first.get("ctx") or {}).get("error")
            message = f"the body is not valid JSON at character {where or 0}" + (f": {why}" if why else "")
            return reply(400, message)
        if first.get("type") == "model_attributes_type":
            message = "the body must be a JSON object (send Content-Type: application/json)"
        return reply(400, f"{where}: {message}" if where else message, param=where or None)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return reply(exc.status_code, str(exc.detail), code="not_found" if exc.status_code == 404 else None)

    @app.exception_handler(GenerationFailed)
    async def engine_failed(request: Request, exc: GenerationFailed) -> JSONResponse:
        log.error("%s", exc, exc_info=exc.__cause__)
        return reply(500, str(exc), kind="server_error")

    # the refusals whose message is the answer: (status, error type, param, code)
    answers = {ModelNotFound: (404, "invalid_request_error", "model", "model_not_found"),
               RequestError: (400, "invalid_request_error", None, None),
               ShuttingDown: (503, "server_error", None, "server_shutting_down"),
               SchedulerFull: (429, "rate_limit_error", None, None)}
    for kind, answer in answers.items():
        async def refused(request: Request, exc: Exception, answer: tuple = answer) -> JSONResponse:
            return reply(answer[0], str(exc), *answer[1:])

        app.add_exception_handler(kind, refused)

    @app.exception_handler(Exception)
    async def failed(request: Request, exc: Exception) -> JSONResponse:
        log.exception("request failed")
        return reply(500, f"internal error: {type(exc).__name__}: {exc}", kind="server_error")


class _Counted:
    """`codespec_requests_total` by route and status, for every answer the app gives: a
    refusal by the middlewares (401, 413), an unhandled failure (500, answered by
    Starlette's outermost layer after this one re-raises), and a body that came too
    slowly (408, answered by the protocol: server/http.py)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status: list[int] = []

        async def sent(message: Message) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, sent)
        except Exception:
            status.append(500)
            raise
        finally:
            if scope.get(TIMED_OUT):
                status = [408]
            if status:
                self._count(scope, status[0])

    def _count(self, scope: Scope, status: int) -> None:
        app = scope.get("app")
        backend = getattr(getattr(app, "state", None), "backend", None)
        if backend is None:
            return
        route = getattr(scope.get("route"), "path", None)
        if route is None:  # refused before routing (401, 413, 408): its path, when it is a route's
            route = scope["path"] if scope["path"] in app.openapi().get("paths", {}) else "unmatched"
        backend.metrics.requests.labels(route, str(status)).inc()


class _BearerAuth:
    """`Authorization: Bearer <key>` on every route but /health (constant-time compare)."""

    def __init__(self, app: ASGIApp, key: str) -> None:
        self.app, self.key = app, key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in UNAUTHENTICATED:
            return await self.app(scope, receive, send)
        header = dict(scope["headers"]).get(b"authorization", b"")
        scheme, _, token = header.partition(b" ")
        if scheme.lower() != b"bearer" or not hmac.compare_digest(token.strip(), self.key):
            response = JSONResponse(error_body("missing or wrong API key: send 'Authorization: Bearer <key>'",
                                               kind="authentication_error", code="invalid_api_key"), 401)
            return await response(scope, receive, send)
        return await self.app(scope, receive, send)


class _BodyLimit:
    """Refuse bodies over `limit` bytes with 413, by Content-Length or while reading a
    chunked body. The body is read here, whole, and replayed to the app: an error raised
    inside the framework's own body reading would come back as its 400."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length")
        too_large = JSONResponse(error_body(f"the request body is over {self.limit} bytes",
                                            code="request_too_large"), 413)
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            return await too_large(scope, receive, send)
        parts, seen, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client left while sending
                return
            parts.append(message.get("body", b""))
            seen += len(parts[-1])
            if seen > self.limit:
                return await too_large(scope, receive, send)
            more = message.get("more_body", False)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(parts), "more_body": False}
            return await receive()  # after the body: the disconnect, when it comes

        await self.app(scope, replay, send)
