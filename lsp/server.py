"""`codespec lsp`: inline completions over the Language Server Protocol (pygls 2.x).

    codespec lsp                       # stdio, the embedded default model in process
    codespec lsp --server URL          # a thin client of a running `codespec serve`
    codespec lsp --tcp 127.0.0.1:2087  # for debugging with a socket

Inline completions are computed in lsp/completion.py, next edits in lsp/next_edit.py;
the documents the editor opened are read through lsp/documents.py. The workspace is indexed in the background on `initialized`, reported with
`window/workDoneProgress`; open buffers feed the index as they change. After a pause
in a document, the prompt of the request most likely to come is prefilled in idle
time (lsp/ahead.py); prompts may start with code from the files the person left
(`contextTokens`, lsp/context.py). Status goes out
as `codespec/status` notifications (`busy`, `indexing`, `ready`, `error`); each item's
command `codespec.accepted` counts accepted completions.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from pathlib import Path
from typing import Any, Callable, Generator
from urllib.parse import unquote, urlparse

from lsprotocol import types
from pygls.exceptions import JsonRpcException, JsonRpcInvalidParams, JsonRpcInvalidRequest
from pygls.lsp.server import LanguageServer
from pygls.protocol import LanguageServerProtocol, lsp_method

from codespec.lsp import next_edit
from codespec.lsp.completion import ACCEPT_COMMAND, complete, complete_ahead, covered
from codespec.lsp.documents import changed, feed, opened, text_of
from codespec.lsp.ahead import Ahead
from codespec.lsp.backend import CompletionBackend, detached, settle
from codespec.lsp.context import Ring
from codespec.lsp.forwarding import Shown
from codespec.lsp.lifecycle import watch_parent
from codespec.lsp.options import LspOptions, parse_options
from codespec.nextedit.history import EditHistory
from codespec.lsp.workspace import index_workspace

log = logging.getLogger("codespec.lsp")
NAME, VERSION = "codespec", "0.1.0"
STATUS = "codespec/status"
STATS = "codespec/stats"


class CodespecProtocol(LanguageServerProtocol):
    """pygls' protocol, except that a request whose params do not deserialize (a negative
    position, params that are not an object) is answered with `InvalidParams` and its id:
    pygls drops it unanswered, and an editor waits for it forever."""

    def structure_message(self, data: dict[str, Any]) -> Any:
        try:
            return super().structure_message(data)
        except JsonRpcException as exc:
            if not (isinstance(data, dict) and isinstance(data.get("method"), str)):
                raise
            # One line, not pygls' traceback per frame: a client that sends many (or never
            # reads our stderr) must not fill the pipe and stall the server.
            log.warning("invalid params for %s%s: %s", data["method"],
                        f" (request {data['id']!r})" if "id" in data else "", str(exc).splitlines()[0][:200])
            if "id" in data:
                error = JsonRpcInvalidParams(f"invalid params for {data['method']}")
                self._send_response(data["id"], error=error.to_response_error())
            return _HANDLED

    @lsp_method(types.INITIALIZE)
    def lsp_initialize(self, params: types.InitializeParams) -> Generator[Any, Any, types.InitializeResult]:
        """pygls' initialize, its capabilities with the next-edit method advertised
        (`experimental.copilotInlineEdit`: no capability names a custom method)."""
        result = yield from super().lsp_initialize(params)
        result.capabilities.experimental = {next_edit.CAPABILITY: True}
        return result

    def handle_message(self, message: Any) -> None:
        if message is _HANDLED:
            return
        if self._shutdown and getattr(message, "method", None) not in (None, types.EXIT) \
                and getattr(message, "id", None) is not None:
            # LSP: a request after `shutdown` is answered InvalidRequest (pygls drops it, and
            # the client waits for ever)
            error = JsonRpcInvalidRequest(f"{message.method} after shutdown: the server is stopping")
            self._send_response(message.id, error=error.to_response_error())
            return
        super().handle_message(message)


_HANDLED = object()  # a frame answered (or dropped) while it was parsed


class CodespecServer(LanguageServer):
    def __init__(self, make_backend: Callable[[], CompletionBackend]) -> None:
        super().__init__(NAME, VERSION, protocol_cls=CodespecProtocol)
        self.make_backend = make_backend
        self.editor_log: Any = None  # lsp.logs.EditorLog, set by the CLI over stdio (only)
        self.backend: CompletionBackend | None = None
        # the model loading (set on `initialized`): a request that comes meanwhile waits for it
        # rather than being answered null, which no editor asks again
        self.loading: asyncio.Future[CompletionBackend | None] | None = None
        self.options = LspOptions()
        # uri -> (the generation running for it, the text before its cursor)
        self.in_flight: dict[str, tuple[asyncio.Task[Any], str]] = {}
        # uri -> a generation whose request was answered early, going on into the forwarding cache
        self.background: dict[str, asyncio.Future[str]] = {}
        self.shown: dict[str, Shown] = {}
        # uri -> (the text before the cursor once the accepted item is in, the completion computed there)
        self.ahead: dict[str, tuple[str, asyncio.Future[None]]] = {}
        self.roots: list[Path] = []
        # accept-command key -> (uri, the text before the cursor once that item is in): items
        # carry the key, never a copy of the document (megabytes per keystroke in big files)
        self.offered: collections.OrderedDict[str, tuple[str, str]] = collections.OrderedDict()
        self.ahead_prefill = Ahead(self._prefill_ahead, self._document, lambda: self.options)
        self.ring = Ring()  # other files' code for the prompt's head (lsp/context.py)
        self.history = EditHistory()  # every document's recent changes, for next edits (lsp/next_edit.py)
        self.where: tuple[str, str, int] | None = None  # the last request's (uri, text, offset)

    # -- helpers ---------------------------------------------------------------------
    def status(self, state: str, message: str = "") -> None:
        self.protocol.notify(STATUS, {"state": state, "message": message})

    def report_server_error(self, error: Exception, source: Any) -> None:
        """Faults are logged (with their traceback at debug level), never shown to the user
        as pygls' "Error in server" pop-ups: a malformed frame is the client's problem."""
        log.warning("%s: %s", getattr(source, "__name__", source), error, exc_info=log.isEnabledFor(logging.DEBUG))

    def warn(self, message: str) -> None:
        self.window_show_message(types.ShowMessageParams(type=types.MessageType.Warning, message=message))

    def relative_path(self, uri: str) -> str:
        path = Path(unquote(urlparse(uri).path))
        for root in self.roots:
            if path.is_relative_to(root):
                return str(path.relative_to(root))
        return path.name

    def _prefill_ahead(self, uri: str, request: Any) -> None:
        prefill = getattr(self.backend, "prefill_ahead", None)  # a backend that cannot ignores it
        if callable(prefill):
            prefill(uri, request)

    def _document(self, uri: str) -> tuple[str, str, Any] | None:
        doc = opened(self, uri)
        return None if doc is None else (text_of(doc), self.relative_path(uri), self.context(uri))

    def context(self, uri: str) -> Any:
        """Other files' code for a prompt in `uri` (lsp/context.py)."""
        return self.ring.context(self.relative_path(uri), self.options.context_tokens)

    def asked_at(self, uri: str, text: str, offset: int) -> None:
        """A request at `offset` of `uri`: a request in another document than the last one
        means the person left that one, whose code joins the cross-file context."""
        if self.where is not None and self.where[0] != uri:
            self.leave(self.where[0])
        self.where = (uri, text, offset)
        self.ahead_prefill.asked(uri, text, offset)

    def leave(self, uri: str) -> None:
        if self.where is not None and self.where[0] == uri:
            self.ring.left(self.relative_path(uri), self.where[1], self.where[2])
            self.where = None

    def ensure_backend(self) -> CompletionBackend:
        if self.backend is None:
            self.backend = self.make_backend()
        return self.backend


def build_server(make_backend: Callable[[], CompletionBackend]) -> CodespecServer:
    server = CodespecServer(make_backend)

    @server.feature(types.INITIALIZE)
    def initialize(ls: CodespecServer, params: types.InitializeParams) -> None:
        if ls.editor_log is not None:  # the log goes to the editor from now on (lsp/logs.py)
            ls.editor_log.attach(asyncio.get_running_loop())
        ls.options, problems = parse_options(params.initialization_options)
        for problem in problems:
            ls.warn(f"codespec: {problem}")
        if params.process_id and ls.editor_log is not None:
            # over stdio only: the editor that started us is on this machine (over --tcp it
            # may be anywhere, and its pid means nothing here)
            watch_parent(params.process_id)
        folders = params.workspace_folders or []
        ls.roots = [Path(unquote(urlparse(f.uri).path)) for f in folders]
        if not ls.roots and params.root_uri:
            ls.roots = [Path(unquote(urlparse(params.root_uri).path))]

    @server.feature(types.INITIALIZED)
    async def initialized(ls: CodespecServer, params: types.InitializedParams) -> None:
        ls.status("busy", "loading the model")
        ls.loading = asyncio.get_running_loop().create_future()
        try:
            backend = await detached(ls.ensure_backend)
        except Exception as exc:  # a wrong model path: say it once, keep the connection
            settle(ls.loading, None)
            ls.status("error", str(exc))
            ls.window_show_message(types.ShowMessageParams(type=types.MessageType.Error,
                                                           message=f"codespec: {exc}"))
            return
        settle(ls.loading, backend)
        if ls.options.index_workspace and ls.roots:
            await index_workspace(ls, backend)
        else:
            ls.status("ready")

    @server.feature(types.TEXT_DOCUMENT_DID_OPEN)
    def did_open(ls: CodespecServer, params: types.DidOpenTextDocumentParams) -> None:
        changed(ls, params.text_document.uri)
        ls.ahead_prefill.changed(params.text_document.uri)

    @server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
    def did_change(ls: CodespecServer, params: types.DidChangeTextDocumentParams) -> None:
        changed(ls, params.text_document.uri)
        ls.ahead_prefill.changed(params.text_document.uri)

    @server.feature(types.TEXT_DOCUMENT_DID_SAVE)
    def did_save(ls: CodespecServer, params: types.DidSaveTextDocumentParams) -> None:
        feed(ls, params.text_document.uri, saved=True)

    @server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(ls: CodespecServer, params: types.DidCloseTextDocumentParams) -> None:
        uri = params.text_document.uri
        ls.shown.pop(uri, None)
        ls.history.forget(uri)
        ls.ahead_prefill.closed(uri)
        ls.leave(uri)
        for task in (ls.in_flight.pop(uri, (None, ""))[0], ls.background.pop(uri, None),
                     (ls.ahead.pop(uri, None) or (None, None))[1]):
            if task is not None:
                task.cancel()

    @server.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)
    def did_change_configuration(ls: CodespecServer, params: types.DidChangeConfigurationParams) -> None:
        ls.options, problems = parse_options(params.settings)
        for problem in problems:
            ls.warn(f"codespec: {problem}")

    @server.command(ACCEPT_COMMAND)
    def accepted(ls: CodespecServer, *args: Any) -> None:
        if ls.backend is not None:
            ls.backend.record_acceptance(True)
        arguments = args[0] if len(args) == 1 and isinstance(args[0], (list, tuple)) else args
        key = arguments[0] if len(arguments) == 1 and isinstance(arguments[0], str) else None
        if key in ls.offered:
            uri, accepted_prefix = ls.offered.pop(key)
            if covered(ls, uri, accepted_prefix):
                return  # the editor asked there already (or the early answer's rest is on its way)
            previous = ls.ahead.pop(uri, None)
            if previous is not None:
                previous[1].cancel()
            ls.ahead[uri] = (accepted_prefix, asyncio.ensure_future(complete_ahead(ls, uri, accepted_prefix)))

    @server.feature(STATS)
    def stats(ls: CodespecServer, params: Any) -> dict[str, Any]:
        """`codespec/stats`: the prompt cache's hit rate, acceptance counts (benchmarks, debugging)."""
        report = getattr(ls.backend, "stats", None)
        return {"backend": report() if callable(report) else None, "open_documents": len(ls.workspace.text_documents),
                "in_flight": len(ls.in_flight)}

    @server.feature(next_edit.METHOD)
    async def copilot_inline_edit(ls: CodespecServer, params: Any) -> dict[str, Any]:
        return await next_edit.inline_edit(ls, params)

    @server.feature(next_edit.SHOWN)
    def did_show_inline_edit(ls: CodespecServer, params: Any) -> None:
        if ls.backend is not None:
            ls.backend.record_acceptance(False)

    @server.command(next_edit.ACCEPT_EDIT)
    def accepted_inline_edit(ls: CodespecServer, *args: Any) -> None:
        if ls.backend is not None:
            ls.backend.record_acceptance(True)

    @server.feature(types.TEXT_DOCUMENT_INLINE_COMPLETION, types.InlineCompletionOptions())
    async def inline_completion(ls: CodespecServer,
                                params: types.InlineCompletionParams) -> types.InlineCompletionList | None:
        return await complete(ls, params)

    return server
