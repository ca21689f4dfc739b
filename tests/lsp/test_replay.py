"""`codespec lsp` through a long, messy editor session (a hang, a
unanswered requests and unbounded threads), over a tiny model so that it runs in the
default suite: a real server process, a real LSP client (pygls).

The client announces no `window.workDoneProgress` (indexing must still happen), opens,
edits, closes and reopens the same documents, storms one with changes, sends requests
that overlap (a newer one cancels the older), on two documents at once, and malformed
ones. Every request must get its answer."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import uuid
from pathlib import Path

import pytest
from lsprotocol import types
from pygls.exceptions import JsonRpcException
from pygls.lsp.client import LanguageClient

from codespec.bench.editor import stop_client
from tests.caches import fresh_cache
from tests.lsp.tiny_fim import tiny_fim_model

ANSWER_S = 60  # a generous bound: an unanswered request used to wait forever
SOURCE = "import math\n\n\ndef area(r):\n    return math.pi * r * r\n\n\ndef scale(xs, k):\n    \n"


def threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError("no thread count")


async def answered(awaitable):
    """The request's answer: a result, None, or the error it was answered with."""
    try:
        return await asyncio.wait_for(awaitable, ANSWER_S)
    except JsonRpcException as exc:
        return exc


def ready_event(client: LanguageClient) -> asyncio.Event:
    """Set when the server reports `codespec/status` ready (or error)."""
    ready = asyncio.Event()

    @client.feature("codespec/status")
    def on_status(params) -> None:
        state = params.get("state") if isinstance(params, dict) else getattr(params, "state", "")
        if state in ("ready", "error"):
            ready.set()

    return ready


@contextlib.asynccontextmanager
async def tiny_lsp(tmp_path: Path, options: dict):
    """A `codespec lsp` over the tiny FIM model, initialized with `options` and ready; shut
    down and stopped after."""
    model = tiny_fim_model(tmp_path / "model")
    env = {**os.environ, "CODESPEC_CACHE_DIR": fresh_cache(tmp_path / "cache")}
    client = LanguageClient("tiny", "1")
    ready = ready_event(client)
    await client.start_io(sys.executable, "-m", "codespec", "lsp", "--model", str(model), env=env)
    try:
        await client.initialize_async(types.InitializeParams(capabilities=types.ClientCapabilities(),
                                                             initialization_options=options))
        client.initialized(types.InitializedParams())
        await asyncio.wait_for(ready.wait(), 300)
        yield client
        await client.shutdown_async(None)
        client.exit(None)
    finally:
        await stop_client(client)


def ask(client: LanguageClient, uri: str, line: int, character: int):
    return client.text_document_inline_completion_async(types.InlineCompletionParams(
        text_document=types.TextDocumentIdentifier(uri), position=types.Position(line=line, character=character),
        context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Automatic)))


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads thread counts from /proc")
def test_a_long_messy_session_gets_every_request_answered(tmp_path):
    asyncio.run(_session(tmp_path))


async def _session(tmp_path: Path) -> None:
    model = tiny_fim_model(tmp_path / "model")
    root = tmp_path / "workspace"
    root.mkdir()
    (root / "geometry.py").write_text(SOURCE)
    (root / "other.py").write_text("def other():\n    return 1\n")
    env = {**os.environ, "CODESPEC_CACHE_DIR": fresh_cache(tmp_path / "cache")}
    client = LanguageClient("replay", "1")
    statuses: list[tuple[str, str]] = []
    ready = asyncio.Event()

    @client.feature("codespec/status")
    def on_status(params) -> None:
        get = (lambda k: params.get(k, "")) if isinstance(params, dict) else (lambda k: getattr(params, k, ""))
        statuses.append((get("state"), get("message")))
        if get("state") in ("ready", "error"):
            ready.set()

    await client.start_io(sys.executable, "-m", "codespec", "lsp", "--model", str(model), env=env)
    try:
        await client.initialize_async(types.InitializeParams(
            capabilities=types.ClientCapabilities(),  # no work-done progress
            workspace_folders=[types.WorkspaceFolder(uri=root.as_uri(), name="ws")],
            initialization_options={"maxTokens": 24, "latencyBudgetMs": 0}))
        client.initialized(types.InitializedParams())
        await asyncio.wait_for(ready.wait(), 300)
        # indexing happened although the client takes no progress reports
        assert statuses[-1][0] == "ready" and "files" in statuses[-1][1], statuses
        pid = client._server.pid  # the server process
        a, b = (root / "geometry.py").as_uri(), (root / "other.py").as_uri()
        results = []
        for round_ in range(3):  # open, edit, ask, close ... and again: the same documents reopened
            for uri, text in ((a, SOURCE), (b, "def other():\n    return 1\n")):
                client.text_document_did_open(types.DidOpenTextDocumentParams(
                    types.TextDocumentItem(uri=uri, language_id="python", version=1, text=text)))
            text = SOURCE
            for version in range(2, 8):
                text = text.replace("    \n", "    y = k\n    \n", 1)
                client.text_document_did_change(types.DidChangeTextDocumentParams(
                    types.VersionedTextDocumentIdentifier(uri=a, version=version),
                    [types.TextDocumentContentChangeWholeDocument(text=text)]))
            line = text.count("\n") - 1
            older = asyncio.ensure_future(ask(client, a, line, 4))  # superseded by the next one
            newer = ask(client, a, line, 4)
            elsewhere = ask(client, b, 1, 4)  # another document at the same time
            results += await asyncio.gather(answered(older), answered(newer), answered(elsewhere))
            for uri in (a, b):
                client.text_document_did_close(types.DidCloseTextDocumentParams(types.TextDocumentIdentifier(uri)))
        assert len(results) == 9  # every one answered (a result, None, or a cancellation error)
        # the last round's newest request was answered with a result, never an error
        assert not isinstance(results[-2], Exception), results[-2]

        # a storm of changes: a thread per change used to pile up
        client.text_document_did_open(types.DidOpenTextDocumentParams(
            types.TextDocumentItem(uri=a, language_id="python", version=1, text=SOURCE)))
        before = threads(pid)
        text = SOURCE * 50
        for version in range(2, 502):
            text += f"x{version} = {version}\n"
            client.text_document_did_change(types.DidChangeTextDocumentParams(
                types.VersionedTextDocumentIdentifier(uri=a, version=version),
                [types.TextDocumentContentChangeWholeDocument(text=text)]))
        result = await answered(ask(client, a, text.count("\n"), 0))
        assert not isinstance(result, Exception), result
        assert threads(pid) <= before + 2, (before, threads(pid))
        if result is not None and result.items:  # items carry a key, not the document
            assert len(json.dumps(result.items[0].command.arguments)) < 64, result.items[0].command.arguments

        # malformed requests are answered with an error, never left hanging
        def raw(params):  # a frame as a careless client writes it, past the client's own type checks
            msg_id = str(uuid.uuid4())
            future = asyncio.get_running_loop().create_future()
            client.protocol._request_futures[msg_id] = future
            client.protocol._send_data({"jsonrpc": "2.0", "id": msg_id, "method": types.TEXT_DOCUMENT_INLINE_COMPLETION,
                                        "params": params})
            return future

        context = {"triggerKind": 1}
        bad = [
            {"textDocument": {"uri": a}, "position": {"line": -1, "character": 0}, "context": context},
            {"textDocument": {"uri": a}, "position": {"line": 10**6, "character": 0}, "context": context},
            [1, 2, 3],
            {"textDocument": {"uri": (root / "never-opened.py").as_uri()}, "position": {"line": 0, "character": 0},
             "context": context},
        ]
        for params in bad:
            outcome = await answered(raw(params))
            assert isinstance(outcome, JsonRpcException), (params, outcome)
            assert "Traceback" not in str(outcome) and str(root) not in str(getattr(outcome, "data", "") or ""), \
                outcome
        # still serving
        assert not isinstance(await answered(ask(client, a, 3, 4)), Exception)
        await client.shutdown_async(None)
        client.exit(None)
    finally:
        await stop_client(client)
