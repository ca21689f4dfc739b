"""Indexing the workspace folders at start-up, with `window/workDoneProgress` reports
where the client takes them, and `codespec/status` "indexing" notices whose message
starts with the percentage done ("40%: json: 4/10 files") for every client."""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import TYPE_CHECKING

from lsprotocol import types

from codespec.lsp.backend import CompletionBackend

if TYPE_CHECKING:
    from codespec.lsp.server import CodespecServer

log = logging.getLogger("codespec.lsp")
PROGRESS_CREATE_TIMEOUT_S = 5.0


async def index_workspace(ls: CodespecServer, backend: CompletionBackend) -> None:
    """Index the workspace, with `window/workDoneProgress` reports where the client
    takes them: a client that lacks the capability, or refuses the token, gets none (the
    LSP spec lets a server work without them) and the `codespec/status` notices only."""
    ls.status("indexing", "0%")
    token = await _progress_token(ls)
    loop = asyncio.get_running_loop()
    shown = {"percent": 0, "done": False}

    def report(message: str, percent: int) -> None:
        if shown["done"]:  # handed over after the end (a backend that reports on this thread): dropped
            return
        if token is not None:
            ls.work_done_progress.report(token, types.WorkDoneProgressReport(message=message, percentage=percent))
        if percent != shown["percent"]:  # the status too, for a status bar: "indexing 40%" (once per percent)
            shown["percent"] = percent
            ls.status("indexing", f"{percent}%: {message}")

    try:
        summary = await backend.index_workspace([str(r) for r in ls.roots],
                                                lambda m, p: loop.call_soon_threadsafe(report, m, p))
    except Exception as exc:
        shown["done"] = True
        log.warning("indexing failed: %s", exc, exc_info=log.isEnabledFor(logging.DEBUG))
        if token is not None:
            ls.work_done_progress.end(token, types.WorkDoneProgressEnd(message=f"failed: {exc}"))
        ls.status("error", f"indexing failed: {exc}")
        return
    shown["done"] = True
    if token is not None:
        ls.work_done_progress.end(token, types.WorkDoneProgressEnd(message=summary))
    ls.status("ready", summary)


async def _progress_token(ls: CodespecServer) -> str | None:
    window = ls.client_capabilities.window
    if window is None or not window.work_done_progress:
        return None
    token = str(uuid.uuid4())
    try:
        await asyncio.wait_for(ls.work_done_progress.create_async(token), PROGRESS_CREATE_TIMEOUT_S)
    except Exception as exc:  # Method Not Found, a refusal, no answer: index without reports
        log.info("indexing without progress reports: the client did not create a token (%s)",
                 str(exc) or type(exc).__name__)
        return None
    ls.work_done_progress.begin(token, types.WorkDoneProgressBegin(title="codespec: indexing", percentage=0))
    return token
