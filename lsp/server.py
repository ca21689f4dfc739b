"""`codespec lsp`: inline completions over the Language Server Protocol (pygls 2.x).

    codespec lsp                       # stdio, the embedded default model in process
    codespec lsp --server URL          # a thin client of a running `codespec serve`
    codespec lsp --tcp 127.0.0.1:2087  # for debugging with a socket

A request flows: the cursor's context is classified (`syntax.classify`: nothing
mid-word, one line, or a block); the forwarding cache answers when the user typed
along the completion shown last (or asks again where it was shown, or where an accepted
completion ends: that one is computed ahead, right after the accept); otherwise, after
a short debounce, the backend
generates, and `syntax.BlockEnd` stops it where the block ends. The latest request per
document wins: a newer request (or `$/cancelRequest`) cancels the older one's
generation. The workspace is indexed in the background on `initialized`, reported with
`window/workDoneProgress`; open buffers feed the index as they change. Status goes out
as `codespec/status` notifications (`busy`, `indexing`, `ready`, `error`); each item's
command `codespec.accepted` counts accepted completions.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable
from urllib.parse import unquote, urlparse

from lsprotocol import types
from pygls.lsp.server import LanguageServer

from codespec.lsp.backend import CompletionBackend, FimRequest
from codespec.lsp.options import LspOptions, parse_options
from codespec.lsp.syntax import BlockEnd, Mode, block_indent, classify, repeats_following

log = logging.getLogger("codespec.lsp")
NAME, VERSION = "codespec", "0.1.0"
ACCEPT_COMMAND = "codespec.accepted"
STATUS = "codespec/status"
CHARS_PER_TOKEN = 4  # budget cut before tokenizing: generous, the backend trims by tokens


@dataclass
class Shown:
    """The completion shown last in a document, for the forwarding cache."""

    prefix: str  # the document text before the cursor when it was computed
    text: str


class CodespecServer(LanguageServer):
    def __init__(self, make_backend: Callable[[], CompletionBackend]) -> None:
        super().__init__(NAME, VERSION)
        self.make_backend = make_backend
        self.backend: CompletionBackend | None = None
        self.options = LspOptions()
        self.in_flight: dict[str, asyncio.Task[Any]] = {}  # uri -> the generation running for it
        self.shown: dict[str, Shown] = {}
        # uri -> (the text before the cursor once the accepted item is in, the completion computed there)
        self.ahead: dict[str, tuple[str, asyncio.Future[None]]] = {}
        self.roots: list[Path] = []

    # -- helpers ---------------------------------------------------------------------
    def status(self, state: str, message: str = "") -> None:
        self.protocol.notify(STATUS, {"state": state, "message": message})

    def warn(self, message: str) -> None:
        self.window_show_message(types.ShowMessageParams(type=types.MessageType.Warning, message=message))

    def relative_path(self, uri: str) -> str:
        path = Path(unquote(urlparse(uri).path))
        for root in self.roots:
            if path.is_relative_to(root):
                return str(path.relative_to(root))
        return path.name

    def ensure_backend(self) -> CompletionBackend:
        if self.backend is None:
            self.backend = self.make_backend()
        return self.backend


def build_server(make_backend: Callable[[], CompletionBackend]) -> CodespecServer:
    server = CodespecServer(make_backend)

    @server.feature(types.INITIALIZE)
    def initialize(ls: CodespecServer, params: types.InitializeParams) -> None:
        ls.options, problems = parse_options(params.initialization_options)
        for problem in problems:
            ls.warn(f"codespec: {problem}")
        folders = params.workspace_folders or []
        ls.roots = [Path(unquote(urlparse(f.uri).path)) for f in folders]
        if not ls.roots and params.root_uri:
            ls.roots = [Path(unquote(urlparse(params.root_uri).path))]

    @server.feature(types.INITIALIZED)
    async def initialized(ls: CodespecServer, params: types.InitializedParams) -> None:
        try:
            backend = await asyncio.to_thread(ls.ensure_backend)
        except Exception as exc:  # a wrong model path: say it once, keep the connection
            ls.status("error", str(exc))
            ls.window_show_message(types.ShowMessageParams(type=types.MessageType.Error,
                                                           message=f"codespec: {exc}"))
            return
        if ls.options.index_workspace and ls.roots:
            await index_workspace(ls, backend)
        else:
            ls.status("ready")

    @server.feature(types.TEXT_DOCUMENT_DID_OPEN)
    def did_open(ls: CodespecServer, params: types.DidOpenTextDocumentParams) -> None:
        feed(ls, params.text_document.uri)

    @server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
    def did_change(ls: CodespecServer, params: types.DidChangeTextDocumentParams) -> None:
        feed(ls, params.text_document.uri)

    @server.feature(types.TEXT_DOCUMENT_DID_SAVE)
    def did_save(ls: CodespecServer, params: types.DidSaveTextDocumentParams) -> None:
        feed(ls, params.text_document.uri, saved=True)

    @server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(ls: CodespecServer, params: types.DidCloseTextDocumentParams) -> None:
        ls.shown.pop(params.text_document.uri, None)

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
        if len(arguments) == 2 and all(isinstance(a, str) for a in arguments):
            uri, accepted_prefix = arguments
            previous = ls.ahead.pop(uri, None)
            if previous is not None:
                previous[1].cancel()
            ls.ahead[uri] = (accepted_prefix, asyncio.ensure_future(complete_ahead(ls, uri, accepted_prefix)))

    @server.feature(types.TEXT_DOCUMENT_INLINE_COMPLETION, types.InlineCompletionOptions())
    async def inline_completion(ls: CodespecServer,
                                params: types.InlineCompletionParams) -> types.InlineCompletionList | None:
        return await complete(ls, params)

    return server


def feed(ls: CodespecServer, uri: str, saved: bool = False) -> None:
    if ls.backend is None:
        return
    doc = ls.workspace.get_text_document(uri)
    ls.backend.update_document(ls.relative_path(uri), doc.source.replace("\r\n", "\n"), saved)


async def index_workspace(ls: CodespecServer, backend: CompletionBackend) -> None:
    token = str(uuid.uuid4())
    ls.status("indexing")
    try:
        await ls.work_done_progress.create_async(token)
        ls.work_done_progress.begin(token, types.WorkDoneProgressBegin(title="codespec: indexing", percentage=0))

        def report(message: str, percent: int) -> None:
            ls.work_done_progress.report(token, types.WorkDoneProgressReport(message=message, percentage=percent))

        loop = asyncio.get_running_loop()
        summary = await backend.index_workspace([str(r) for r in ls.roots],
                                                lambda m, p: loop.call_soon_threadsafe(report, m, p))
        ls.work_done_progress.end(token, types.WorkDoneProgressEnd(message=summary))
        ls.status("ready", summary)
    except Exception as exc:
        log.exception("indexing failed")
        ls.status("error", f"indexing failed: {exc}")


async def complete(ls: CodespecServer, params: types.InlineCompletionParams) -> types.InlineCompletionList | None:
    uri = params.text_document.uri
    if not ls.options.enable or ls.backend is None:
        return None
    doc = ls.workspace.get_text_document(uri)
    text = doc.source.replace("\r\n", "\n")
    # pygls converts the client's position (UTF-16 unless negotiated otherwise) to an index
    offset = doc.offset_at_position(params.position)
    if "\r\n" in doc.source:
        offset -= doc.source[:offset].count("\r\n")
    ahead = ls.ahead.pop(uri, None)
    if ahead is not None:
        if ahead[0] == text[:offset]:
            await asyncio.shield(ahead[1])  # computed since the accept: finish it rather than start over
        else:
            ahead[1].cancel()  # the user went elsewhere: it must not cancel this request later
    cached = forward(ls.shown.get(uri), text[:offset])
    if cached is not None:
        return _items(params.position, cached, uri, text[:offset])
    completion = await generate(ls, uri, text, offset, doc.language_id or "")
    return None if completion is None else _items(params.position, completion, uri, text[:offset])


async def complete_ahead(ls: CodespecServer, uri: str, prefix: str) -> None:
    """After an accept, compute the next completion at the end of the accepted text, so
    that the editor's next request finds it in the cache."""
    for _ in range(50):  # the accepted text reaches the server as a didChange soon after
        doc = ls.workspace.get_text_document(uri)
        text = doc.source.replace("\r\n", "\n")
        if text.startswith(prefix):
            break
        await asyncio.sleep(0.02)
    else:
        return
    try:
        await generate(ls, uri, text, len(prefix), doc.language_id or "")
    except (asyncio.CancelledError, Exception):
        log.debug("completion ahead dropped", exc_info=True)


async def generate(ls: CodespecServer, uri: str, text: str, offset: int, language_id: str) -> str | None:
    """Generate a completion at `offset` (cancelling the document's older one), cut at
    the block end; cached in `ls.shown` for the forwarding cache."""
    assert ls.backend is not None
    mode = classify(text, offset, language_id)
    if mode is Mode.MULTI and not ls.options.multiline:
        mode = Mode.SINGLE
    if mode is Mode.NONE:
        return None
    prefix, suffix = text[:offset], text[offset:]
    failure = ""
    previous = ls.in_flight.pop(uri, None)
    if previous is not None:
        previous.cancel()  # the latest request per document wins
    task = asyncio.current_task()
    assert task is not None
    ls.in_flight[uri] = task
    try:
        await asyncio.sleep(ls.options.debounce_ms / 1000)  # a keystroke storm cancels here
        ls.status("busy")
        block = BlockEnd(mode, block_indent(text, offset), language_id)
        opts = ls.options
        request = FimRequest(
            prefix[-opts.prefix_tokens * CHARS_PER_TOKEN :], suffix[: opts.suffix_tokens * CHARS_PER_TOKEN],
            opts.max_tokens, ls.relative_path(uri), opts.prefix_tokens, opts.suffix_tokens,
        )
        try:
            raw = await ls.backend.complete(request, on_text=lambda so_far: not block.cut(so_far)[1])
        except Exception as exc:  # the backend failed (server gone, prompt refused): say so, serve on
            log.warning("completion failed: %s", exc)
            failure = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            return None
        completion = block.finish(raw)
    finally:
        if ls.in_flight.get(uri) is task:
            del ls.in_flight[uri]
        ls.status("error" if failure else "ready", failure)
    if not completion.strip() or repeats_following(completion, text, offset):
        return None
    ls.shown[uri] = Shown(prefix, completion)
    ls.backend.record_acceptance(False)
    return completion


def forward(shown: Shown | None, prefix: str) -> str | None:
    """The rest of the completion shown last, if the user typed along it.

    >>> forward(Shown("def f():\\n    ", "return 1\\n"), "def f():\\n    ret")
    'urn 1\\n'
    """
    if shown is None or not prefix.startswith(shown.prefix):
        return None
    typed = prefix[len(shown.prefix) :]
    if not shown.text.startswith(typed) or len(typed) >= len(shown.text.rstrip()):
        return None
    return shown.text[len(typed) :]


def _items(position: types.Position, text: str, uri: str, prefix: str) -> types.InlineCompletionList:
    # the command tells the server what the document starts with once the item is accepted
    item = types.InlineCompletionItem(
        insert_text=text,
        range=types.Range(start=position, end=position),
        command=types.Command(title="codespec: accepted", command=ACCEPT_COMMAND, arguments=[uri, prefix + text]),
    )
    return types.InlineCompletionList(items=[item])
