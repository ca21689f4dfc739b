"""`codespec lsp`: inline completions over the Language Server Protocol (pygls 2.x).

    codespec lsp                       # stdio, the embedded default model in process
    codespec lsp --server URL          # a thin client of a running `codespec serve`
    codespec lsp --tcp 127.0.0.1:2087  # for debugging with a socket

A request flows: the cursor's context is classified (`syntax.classify`: nothing
mid-word, one line, or a block); the forwarding cache answers when the user typed
along the completion shown last (or asks again where it was shown, or where an accepted
completion ends: that one is computed ahead, right after the accept); otherwise, after
a short debounce, the backend
generates, and stops where the block ends. Whatever the path, the text served is cut for
the request it answers by one function, `lsp.cut.Landing.fit`. The latest request per
document wins: a newer request (or `$/cancelRequest`) cancels the older one's
generation. The workspace is indexed in the background on `initialized`, reported with
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
import itertools
import logging
import time
from pathlib import Path
from typing import Any, Callable, Generator
from urllib.parse import unquote, urlparse

from lsprotocol import types
from pygls.exceptions import JsonRpcException, JsonRpcInvalidParams, JsonRpcInvalidRequest
from pygls.lsp.server import LanguageServer
from pygls.protocol import LanguageServerProtocol, lsp_method

from codespec.lsp import next_edit
from codespec.lsp.ahead import Ahead
from codespec.lsp.backend import CompletionBackend, detached, settle
from codespec.lsp.context import Ring
from codespec.landing.cut import Landing
from codespec.lsp.forwarding import Shown, along, forward
from codespec.lsp.lifecycle import watch_parent
from codespec.landing.fit import fit_indent, replaced_after, rest_of_line
from codespec.lsp.options import LspOptions, parse_options
from codespec.landing.syntax import Mode, classify
from codespec.landing.lines import whole_lines
from codespec.nextedit.history import EditHistory
from codespec.lsp.window import fim_request
from codespec.lsp.workspace import index_workspace

log = logging.getLogger("codespec.lsp")
NAME, VERSION = "codespec", "0.1.0"
ACCEPT_COMMAND = "codespec.accepted"
STATUS = "codespec/status"
STATS = "codespec/stats"
OFFERED_KEEP = 64  # accept-command keys remembered (the items of the last few requests)


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
        return None if doc is None else (doc.source.replace("\r\n", "\n"), self.relative_path(uri), self.context(uri))

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
        feed(ls, params.text_document.uri)
        ls.ahead_prefill.changed(params.text_document.uri)
        remember(ls, params.text_document.uri)

    @server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
    def did_change(ls: CodespecServer, params: types.DidChangeTextDocumentParams) -> None:
        feed(ls, params.text_document.uri)
        ls.ahead_prefill.changed(params.text_document.uri)
        remember(ls, params.text_document.uri)

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
            if _covered(ls, uri, accepted_prefix):
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


def opened(ls: CodespecServer, uri: str) -> Any:
    """The document if the editor opened it, else None. Never `get_text_document`: it
    reads a document it does not hold from disk (any path a client names)."""
    return ls.workspace.text_documents.get(unquote(uri))


def open_document(ls: CodespecServer, uri: str) -> Any:
    """A document the editor opened; anything else (a path never opened, a file the
    server would have to read from disk) is refused with `InvalidParams`."""
    doc = opened(ls, uri)
    if doc is None:
        raise JsonRpcInvalidParams(f"{uri} is not open: send textDocument/didOpen first")
    return doc


def remember(ls: CodespecServer, uri: str) -> None:
    """The document's text into its edit history (next edits see the changes)."""
    doc = opened(ls, uri)
    if doc is not None:
        ls.history.update(uri, doc.source.replace("\r\n", "\n"))


def feed(ls: CodespecServer, uri: str, saved: bool = False) -> None:
    doc = opened(ls, uri)
    if ls.backend is None or doc is None:
        return
    ls.backend.update_document(ls.relative_path(uri), doc.source.replace("\r\n", "\n"), saved)


async def complete(ls: CodespecServer, params: types.InlineCompletionParams) -> types.InlineCompletionList | None:
    uri = params.text_document.uri
    asked_at = time.monotonic()
    if ls.backend is None and ls.loading is not None:
        await asyncio.shield(ls.loading)  # cancelled with the request (a keystroke, `$/cancelRequest`)
    if not ls.options.enable or ls.backend is None:
        return None
    doc = open_document(ls, uri)
    text = doc.source.replace("\r\n", "\n")
    lines = doc.lines
    if params.position.line > len(lines) or params.position.character > 1 << 20:  # len(lines): after a final \n
        raise JsonRpcInvalidParams(f"position {params.position.line}:{params.position.character} is outside "
                                   f"the document ({len(lines)} lines)")
    # pygls converts the client's position (UTF-16 unless negotiated otherwise) to an index
    # (a character past the line's end counts as its end)
    offset = doc.offset_at_position(params.position)
    if "\r\n" in doc.source:
        offset -= doc.source[:offset].count("\r\n")
    ls.asked_at(uri, text, offset)
    ahead = ls.ahead.pop(uri, None)
    if ahead is not None:
        if ahead[0] == text[:offset]:
            await asyncio.shield(ahead[1])  # computed since the accept: finish it rather than start over
        else:
            ahead[1].cancel()  # the user went elsewhere: it must not cancel this request later
    language_id = doc.language_id or ""
    cached = await typed_along(ls, uri, text[:offset])
    shown = ls.shown.get(uri)
    if cached is not None and shown is not None:  # cut again for this request: its block, not the one it was made for
        return _items(ls, params.position, cached, Landing.at(text, offset, language_id, shown.mode, shown.indent),
                      uri)
    landing = landing_at(ls, text, offset, language_id)
    completion = await generate(ls, uri, landing, asked_at)
    answer = None if completion is None else _items(ls, params.position, completion, landing, uri)
    if answer is None and params.context.trigger_kind == types.InlineCompletionTriggerKind.Invoked:
        # asked for explicitly: say so rather than spin and show nothing
        ls.status("ready", NOTHING_HERE)
    return answer


def landing_at(ls: CodespecServer, text: str, offset: int, language_id: str) -> Landing:
    """Where a request at `offset` lands; one line only when the editor asked for that."""
    mode = classify(text, offset, language_id)
    return Landing.at(text, offset, language_id, Mode.SINGLE if mode is Mode.MULTI and not ls.options.multiline
                      else mode)


NOTHING_HERE = "no suggestion here: the model ended the block at once, or only repeated the lines below"


def _covered(ls: CodespecServer, uri: str, prefix: str) -> bool:
    """A generation already running serves a request at `prefix`: one the editor asked
    there (VS Code asks again right after an accept, before it runs the item's command),
    or one answered early whose rest continues the accepted text. A second generation
    would cancel it, and the editor's request would be answered null."""
    if uri in ls.in_flight and ls.in_flight[uri][1] == prefix:
        return True
    running = ls.background.get(uri)
    return running is not None and not running.done() and along(ls.shown.get(uri), prefix)


async def typed_along(ls: CodespecServer, uri: str, prefix: str) -> str | None:
    """The forwarding cache's answer: the rest of the completion shown last, when the
    person typed (or accepted) along it. While a generation answered early is still going
    on for that completion, wait for its next whole line rather than start over."""
    while True:
        cached = forward(ls.shown.get(uri), prefix)
        running = ls.background.get(uri)
        if running is None or running.done() or not along(ls.shown.get(uri), prefix):
            return cached
        if cached is not None and "\n" in cached.lstrip("\n"):
            return cached  # a whole line beyond what was typed is ready
        await asyncio.sleep(0.01)


async def complete_ahead(ls: CodespecServer, uri: str, prefix: str) -> None:
    """After an accept, compute the next completion at the end of the accepted text, so
    that the editor's next request finds it in the cache."""
    for _ in range(50):  # the accepted text reaches the server as a didChange soon after
        doc = opened(ls, uri)
        if doc is None:  # closed meanwhile
            return
        text = doc.source.replace("\r\n", "\n")
        if text.startswith(prefix):
            break
        await asyncio.sleep(0.02)
    else:
        return
    try:
        await generate(ls, uri, landing_at(ls, text, len(prefix), doc.language_id or ""))
    except (asyncio.CancelledError, Exception):
        log.debug("completion ahead dropped", exc_info=True)


async def generate(ls: CodespecServer, uri: str, landing: Landing, asked_at: float | None = None) -> str | None:
    """Generate a completion where `landing` says (cancelling the document's older one),
    cut for it; cached in `ls.shown` for the forwarding cache.

    Latency first: once `latencyBudgetMs` has passed since the request came (`asked_at`,
    `time.monotonic()`)
    and whole lines are ready, the request is answered with them, and the generation goes
    on in the background to the block end, into the forwarding cache: the editor's next
    request, after the person accepted or typed along those lines, finds the rest there."""
    assert ls.backend is not None
    loop = asyncio.get_running_loop()
    asked_at = time.monotonic() if asked_at is None else asked_at
    text, offset, language_id = landing.text, landing.offset, landing.language_id
    if landing.mode is Mode.NONE:
        return None
    prefix = text[:offset]
    failure = ""
    for previous in (ls.in_flight.pop(uri, (None, ""))[0], ls.background.pop(uri, None)):
        if previous is not None:
            previous.cancel()  # the latest request per document wins
    task = asyncio.current_task()
    assert task is not None
    ls.in_flight[uri] = (task, prefix)
    try:
        await asyncio.sleep(ls.options.debounce_ms / 1000)  # a keystroke storm cancels here
        ls.status("busy")
        opts = ls.options
        request, held = fim_request(text, offset, opts, ls.relative_path(uri), ls.context(uri))

        def finish(raw: str) -> str:
            healed = held.heal(raw)
            return "" if healed is None else landing.fit(healed)

        early: asyncio.Future[str] = loop.create_future()
        budget_s = opts.latency_budget_ms / 1000

        def on_text(so_far: str) -> bool:  # any thread (the scheduler's, an HTTP reader's)
            healed = held.heal(so_far)
            if healed is None:
                return False  # the model disagrees with the cursor's indentation
            kept, finished = landing.cut(healed)
            if not finished and opts.latency_budget_ms and time.monotonic() - asked_at >= budget_s:
                lines = whole_lines(fit_indent(kept, text, offset, language_id))
                if lines.strip():
                    loop.call_soon_threadsafe(settle, early, lines)
                    loop.call_soon_threadsafe(_grow, ls, uri, prefix, lines)
            return not finished

        full = asyncio.ensure_future(ls.backend.complete(request, on_text=on_text))
        try:
            await asyncio.wait({full, early}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            full.cancel()
            raise
        if not full.done():  # answer with the lines ready; the rest goes on into the cache
            ls.background[uri] = full
            full.add_done_callback(lambda f: _store_rest(ls, uri, landing, finish, f))
            completion = early.result()
        else:
            try:
                raw = full.result()
            except Exception as exc:  # the backend failed (server gone, prompt refused): say so, serve on
                log.warning("completion failed: %s", exc)
                failure = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                return None
            completion = finish(raw)
    finally:
        if ls.in_flight.get(uri, (None, ""))[0] is task:
            del ls.in_flight[uri]
        if uri not in ls.background:
            ls.status("error" if failure else "ready", failure)
    if not completion:
        return None
    ls.shown[uri] = Shown(prefix, completion, landing.mode, landing.indent)
    ls.backend.record_acceptance(False)
    return completion


def _grow(ls: CodespecServer, uri: str, prefix: str, lines: str) -> None:
    """Whole lines of a generation answered early, into the forwarding cache as they come."""
    shown = ls.shown.get(uri)
    if uri in ls.background and shown is not None and shown.prefix == prefix and lines.startswith(shown.text):
        ls.shown[uri] = Shown(prefix, lines, shown.mode, shown.indent)


def _store_rest(ls: CodespecServer, uri: str, landing: Landing, finish: Callable[[str], str],
                full: asyncio.Future[str]) -> None:
    """A generation that went on after its request was answered: its whole block replaces
    the lines shown, in the forwarding cache."""
    if ls.background.get(uri) is full:
        del ls.background[uri]
        ls.status("ready")
    if full.cancelled() or full.exception() is not None:
        return
    completion = finish(full.result())
    prefix = landing.text[: landing.offset]
    if completion:
        shown = ls.shown.get(uri)
        if shown is None or shown.prefix == prefix:  # nothing newer was shown meanwhile
            ls.shown[uri] = Shown(prefix, completion, landing.mode, landing.indent)


_keys = itertools.count(1)


def _items(ls: CodespecServer, position: types.Position, completion: str, landing: Landing,
           uri: str) -> types.InlineCompletionList | None:
    """The answer to a request where `landing` says: every path ends here, and serves
    `completion` only as `Landing.fit` cuts it for this request (None: nothing left)."""
    completion = landing.fit(completion)
    if not completion:
        return None
    text, offset = landing.text, landing.offset
    # the command's one argument is a key: the server keeps what the document starts with
    # once the item is accepted
    key = f"c{next(_keys)}"
    ls.offered[key] = (uri, text[:offset] + completion)
    while len(ls.offered) > OFFERED_KEEP:
        ls.offered.popitem(last=False)
    # closers the editor put after the cursor (an auto-closed bracket) that the completion
    # writes itself are replaced, not doubled; they are ASCII, so characters are UTF-16 units
    replaced = replaced_after(completion, rest_of_line(text, offset))
    end = types.Position(line=position.line, character=position.character + replaced)
    item = types.InlineCompletionItem(
        insert_text=completion,
        range=types.Range(start=position, end=end),
        command=types.Command(title="codespec: accepted", command=ACCEPT_COMMAND, arguments=[key]),
    )
    return types.InlineCompletionList(items=[item])
