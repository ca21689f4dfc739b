"""Fuzzing the language server: hypothesis-generated JSON-RPC params for its
requests (inline completion, execute command, stats) and notifications (open, change,
close, configuration), sent raw past the client's own type checks, to a real `codespec
lsp` over a tiny model. Every request is answered with its id (a result or an error
without a traceback or a server path) within seconds, and the server still completes
after. The count is bounded (CI's time)."""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lsprotocol import types
from pygls.exceptions import JsonRpcException
from pygls.lsp.client import LanguageClient

import codespec
from codespec.bench.editor import stop_client
from tests.caches import fresh_cache
from tests.lsp.test_replay import ready_event, ask
from tests.lsp.tiny_fim import tiny_fim_model

SERVER_CODE = str(Path(codespec.__file__).resolve().parent)
EXAMPLES = 120
ANSWER_S = 30
TEXT = "import os\n\n\ndef size(path):\n    return os.path.getsize(path)\n\n\ndef main():\n    \n"

scalars = (st.none() | st.booleans() | st.integers(min_value=-(2**64), max_value=2**64) | st.floats()
           | st.text(max_size=20))
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=10), inner, max_size=3), max_leaves=10)


def odd(valid):
    return valid | json_values


positions = st.fixed_dictionaries({"line": odd(st.integers(-3, 12)), "character": odd(st.integers(-3, 200))})


@st.composite
def messages(draw, uri: str):
    """(method, params, is_request): mostly near-valid, sometimes anything."""
    document = odd(st.fixed_dictionaries({"uri": odd(st.sampled_from([uri, "file:///etc/passwd", "untitled:1",
                                                                      "not a uri"]))}))
    kind = draw(st.sampled_from(["inline"] * 4 + ["command", "stats", "open", "change", "close", "config"]))
    if kind == "inline":
        params = draw(odd(st.fixed_dictionaries(
            {"textDocument": document, "position": odd(positions)},
            optional={"context": odd(st.fixed_dictionaries({"triggerKind": odd(st.sampled_from([1, 2, 7]))}))})))
        return types.TEXT_DOCUMENT_INLINE_COMPLETION, params, True
    if kind == "command":
        params = draw(odd(st.fixed_dictionaries({"command": odd(st.sampled_from(["codespec.accept", "rm -rf"])),
                                                 "arguments": odd(st.lists(json_values, max_size=3))})))
        return types.WORKSPACE_EXECUTE_COMMAND, params, True
    if kind == "stats":
        return "codespec/stats", draw(json_values), True
    if kind == "open":
        item = odd(st.fixed_dictionaries({"uri": odd(st.just(uri)), "languageId": odd(st.just("python")),
                                          "version": odd(st.integers(0, 9)), "text": odd(st.text(max_size=80))}))
        return types.TEXT_DOCUMENT_DID_OPEN, draw(odd(st.fixed_dictionaries({"textDocument": item}))), False
    if kind == "change":
        change = odd(st.fixed_dictionaries({"text": odd(st.text(max_size=80))},
                                           optional={"range": odd(st.fixed_dictionaries(
                                               {"start": positions, "end": positions}))}))
        params = odd(st.fixed_dictionaries({"textDocument": odd(st.fixed_dictionaries(
            {"uri": st.just(uri), "version": odd(st.integers(0, 99))})), "contentChanges": odd(st.lists(change,
                                                                                                      max_size=2))}))
        return types.TEXT_DOCUMENT_DID_CHANGE, draw(params), False
    if kind == "close":
        return types.TEXT_DOCUMENT_DID_CLOSE, draw(odd(st.fixed_dictionaries({"textDocument": document}))), False
    return types.WORKSPACE_DID_CHANGE_CONFIGURATION, draw(odd(st.fixed_dictionaries({"settings": json_values}))), False


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    """A running `codespec lsp` over the tiny model, on an event loop of its own."""
    tmp = tmp_path_factory.mktemp("fuzz")
    model = tiny_fim_model(tmp / "model")
    root = tmp / "ws"
    root.mkdir()
    doc = root / "main.py"
    doc.write_text(TEXT)
    loop = asyncio.new_event_loop()
    client = LanguageClient("fuzz", "1")
    ready = ready_event(client)
    editor_log: list[str] = []  # the server's log arrives as window/logMessage (lsp/logs.py)

    @client.feature(types.WINDOW_LOG_MESSAGE)
    def on_log(params: types.LogMessageParams) -> None:
        editor_log.append(params.message)

    async def start() -> None:
        await client.start_io(sys.executable, "-m", "codespec", "lsp", "--model", str(model),
                              env={**os.environ, "CODESPEC_CACHE_DIR": fresh_cache(tmp / "cache")})
        await client.initialize_async(types.InitializeParams(
            capabilities=types.ClientCapabilities(), workspace_folders=[types.WorkspaceFolder(root.as_uri(), "ws")],
            initialization_options={"maxTokens": 8, "latencyBudgetMs": 0}))
        client.initialized(types.InitializedParams())
        await asyncio.wait_for(ready.wait(), 300)
        client.text_document_did_open(types.DidOpenTextDocumentParams(
            types.TextDocumentItem(uri=doc.as_uri(), language_id="python", version=1, text=TEXT)))

    loop.run_until_complete(start())
    log: list[bytes] = []
    client.editor_log = editor_log

    async def drain() -> None:  # as an editor does (its Output panel); an undrained pipe stalls any server
        while line := await client._server.stderr.readline():
            log.append(line)

    reader = loop.create_task(drain())
    yield loop, client, doc.as_uri(), log
    reader.cancel()

    async def stop() -> None:
        await stop_client(client)

    loop.run_until_complete(stop())
    loop.close()


def send(client: LanguageClient, method: str, params, is_request: bool):
    frame = {"jsonrpc": "2.0", "method": method, "params": params}
    if not is_request:
        client.protocol._send_data(frame)
        return None
    msg_id = str(uuid.uuid4())
    future = asyncio.get_running_loop().create_future()
    client.protocol._request_futures[msg_id] = future
    client.protocol._send_data({**frame, "id": msg_id})
    return future


@st.composite
def batches(draw):
    return draw(st.lists(messages(FUZZ_URI[0]), min_size=1, max_size=4))


FUZZ_URI = ["file:///placeholder/main.py"]  # set from the session before the fuzz runs


def test_every_request_is_answered_and_the_server_lives(session):
    loop, client, uri, log = session
    FUZZ_URI[0] = uri

    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(batch=batches())
    def each(batch) -> None:
        async def run() -> None:
            pending = [(m, p, send(client, m, p, r)) for m, p, r in batch]
            for method, params, future in pending:
                if future is None:
                    continue
                try:
                    await asyncio.wait_for(future, ANSWER_S)
                except JsonRpcException as exc:  # an error answer: fine, if it leaks nothing
                    told = f"{exc} {getattr(exc, 'data', '')}"
                    leaks = ("Traceback", "site-packages", SERVER_CODE)  # the client's own URIs may come back
                    assert not any(leak in told for leak in leaks), (method, params, told)
                except asyncio.TimeoutError:
                    raise AssertionError(f"{method} with {params!r} was never answered") from None

        loop.run_until_complete(run())

    each()

    async def still_serving():
        client.text_document_did_open(types.DidOpenTextDocumentParams(
            types.TextDocumentItem(uri=uri, language_id="python", version=10_000, text=TEXT)))
        return await asyncio.wait_for(ask(client, uri, 8, 4), ANSWER_S)

    assert not isinstance(loop.run_until_complete(still_serving()), Exception)
    stderr = b"".join(log).decode(errors="replace")
    assert "Traceback" not in stderr, stderr[-3000:]  # one line per malformed frame, at the default level
    logged = "\n".join(client.editor_log)
    assert "Traceback" not in logged, logged[-3000:]
    assert "invalid params for" in logged, logged[-3000:]
