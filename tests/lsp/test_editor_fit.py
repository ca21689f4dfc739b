"""What VS Code users met, over the real server with a scripted backend
(`tests/lsp/scripted.py`): the text is fixed, so each case is exact.

Each script is what the model writes after the prompt's middle, the whitespace held
back from it included (`landing.lines.HeldSpace`).

- a request sent while the model loads is answered once it has loaded, not with null;
- an auto-closed bracket the completion writes itself is replaced, not doubled;
- a completion indented one level too deep on a blank line comes back to the cursor's;
- a completion cut by the token limit keeps its complete lines only;
- the request VS Code sends right after an accept (before the accept command) is answered;
- an explicit request that yields nothing says so in the status;
- the server ends when the editor goes, even in the middle of the model's load;
- the log reaches the editor as `window/logMessage` at each line's level (VS Code marks
  every stderr line `[error]`).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from lsprotocol import types
from pygls.lsp.client import LanguageClient

from codespec.bench.editor import stop_client
from codespec.lsp.completion import NOTHING_HERE

ROOT = Path(__file__).parents[2]
ANSWER_S = 30


def script(text: str) -> str:
    return "#> " + json.dumps(text)


class Editor:
    def __init__(self, client: LanguageClient, statuses: list[tuple[str, str]], root: Path) -> None:
        self.client, self.statuses, self.root, self.version = client, statuses, root, 1

    def open(self, name: str, text: str) -> str:
        uri = (self.root / name).as_uri()
        self.client.text_document_did_open(types.DidOpenTextDocumentParams(
            types.TextDocumentItem(uri=uri, language_id="python", version=1, text=text)))
        return uri

    def change(self, uri: str, text: str) -> None:
        self.version += 1
        self.client.text_document_did_change(types.DidChangeTextDocumentParams(
            types.VersionedTextDocumentIdentifier(uri=uri, version=self.version),
            [types.TextDocumentContentChangeWholeDocument(text=text)]))

    async def ask(self, uri: str, text: str, offset: int, invoked: bool = False):
        line = text[:offset].count("\n")
        character = offset - (text.rfind("\n", 0, offset) + 1)
        kind = types.InlineCompletionTriggerKind.Invoked if invoked else types.InlineCompletionTriggerKind.Automatic
        return await asyncio.wait_for(self.client.text_document_inline_completion_async(types.InlineCompletionParams(
            text_document=types.TextDocumentIdentifier(uri), position=types.Position(line=line, character=character),
            context=types.InlineCompletionContext(trigger_kind=kind))), ANSWER_S)


async def editor(tmp_path: Path, *args: str, ready: bool = True,
                 options: dict | None = None) -> tuple[LanguageClient, Editor]:
    client = LanguageClient("scripted-editor", "1")
    statuses: list[tuple[str, str]] = []
    loaded = asyncio.Event()
    client.logs = []

    @client.feature(types.WINDOW_LOG_MESSAGE)
    def on_log(params: types.LogMessageParams) -> None:
        client.logs.append((params.type, params.message))

    @client.feature("codespec/status")
    def on_status(params) -> None:
        get = (lambda k: params.get(k, "")) if isinstance(params, dict) else (lambda k: getattr(params, k, ""))
        statuses.append((get("state"), get("message")))
        if get("state") == "ready":
            loaded.set()

    await client.start_io(sys.executable, "-m", "tests.lsp.scripted", *args, cwd=str(ROOT))
    client.initialized_with = await client.initialize_async(types.InitializeParams(
        capabilities=types.ClientCapabilities(), root_uri=tmp_path.as_uri(),
        initialization_options={"indexWorkspace": False, "debounceMs": 0, "latencyBudgetMs": 0, **(options or {})}))
    client.initialized(types.InitializedParams())
    if ready:
        await asyncio.wait_for(loaded.wait(), ANSWER_S)
    return client, Editor(client, statuses, tmp_path)


def run(coroutine_function, tmp_path: Path, *args: str, ready: bool = True, options: dict | None = None) -> None:
    async def session() -> None:
        client, ed = await editor(tmp_path, *args, ready=ready, options=options)
        try:
            await coroutine_function(ed)
        finally:
            await stop_client(client)

    asyncio.run(session())


def test_a_request_while_the_model_loads_is_answered_once_it_has(tmp_path):
    async def case(ed: Editor) -> None:
        text = f"def f(a):\n    {script('    return a')}\n    "
        uri = ed.open("load.py", text)
        result = await ed.ask(uri, text, len(text))  # sent at once: the load takes 2 s
        assert result is not None and result.items[0].insert_text == "return a"
        assert ("busy", "loading the model") in ed.statuses

    run(case, tmp_path, "--load-s", "2", ready=False)


def test_an_auto_closed_bracket_is_replaced_not_doubled(tmp_path):
    async def case(ed: Editor) -> None:
        head = f"{script('include) == names')}\nassert callable("
        text = head + ")\n"
        uri = ed.open("brackets.py", text)
        item = (await ed.ask(uri, text, len(head))).items[0]
        assert item.insert_text == "include) == names"
        # the item replaces the editor's `)`: accepting gives `assert callable(include) == names`
        assert (item.range.start.character, item.range.end.character) == (16, 17), item.range
        # a completion that does not close the bracket goes in before it
        head = f"{script('include')}\nassert callable("
        text = head + ")\n"
        ed.change(uri, text)
        item = (await ed.ask(uri, text, len(head))).items[0]
        assert item.insert_text == "include" and item.range.end.character == 16, item.range

    run(case, tmp_path)


def test_a_completion_indented_too_deep_comes_back_to_the_cursor(tmp_path):
    async def case(ed: Editor) -> None:
        body = "        total = a + b\n        return total"  # the 4 held back + 4 too many
        head = f"def add(a, b):\n    {script(body)}\n    "
        text = head + "\n"
        uri = ed.open("indent.py", text)
        item = (await ed.ask(uri, text, len(head))).items[0]
        assert item.insert_text == "total = a + b\n    return total", item.insert_text
        compile(head + item.insert_text + "\n", "indent.py", "exec")  # no IndentationError
        # after a line that opens a block, the deeper line is its body: kept
        head = f"def add(a, b):\n    {script('        return a')}\n    if a:\n    "
        text = head + "\n"
        ed.change(uri, text)
        item = (await ed.ask(uri, text, len(head))).items[0]
        assert item.insert_text == "    return a", item.insert_text

    run(case, tmp_path)


def test_a_completion_cut_by_the_token_limit_keeps_its_complete_lines(tmp_path):
    async def case(ed: Editor) -> None:
        # the scripted text stops where maxTokens would: inside an unclosed `return (`
        cut = script("    x = a * b\n    return (x +")
        head = f"def f(a, b):\n    {cut}\n    "
        text = head + "\n"
        uri = ed.open("limit.py", text)
        item = (await ed.ask(uri, text, len(head))).items[0]
        assert item.insert_text == "x = a * b", item.insert_text

    run(case, tmp_path)


def test_the_request_right_after_an_accept_is_answered(tmp_path):
    async def case(ed: Editor) -> None:
        first = f"def f(a):\n    {script('    x = a + 1')}\n    "
        text = first + "\n"
        uri = ed.open("accept.py", text)
        item = (await ed.ask(uri, text, len(first))).items[0]
        # VS Code on Tab: the text changes, it asks at the new end at once, then runs the command
        accepted = first + item.insert_text
        text = accepted + "\n"
        ed.change(uri, text)
        asked = asyncio.ensure_future(ed.ask(uri, text, len(accepted)))
        await asyncio.sleep(0.2)  # the server is generating for it when the command comes
        await ed.client.workspace_execute_command_async(types.ExecuteCommandParams(
            command=item.command.command, arguments=item.command.arguments))
        result = await asked
        assert result is not None and result.items, result

    run(case, tmp_path, "--char-s", "0.05")


def test_an_explicit_request_with_nothing_to_offer_says_so(tmp_path):
    async def case(ed: Editor) -> None:
        text = f"{script('')}\nx = "
        uri = ed.open("nothing.py", text)
        assert await ed.ask(uri, text, len(text), invoked=True) is None
        for _ in range(100):
            if ("ready", NOTHING_HERE) in ed.statuses:
                return
            await asyncio.sleep(0.02)
        raise AssertionError(ed.statuses)

    run(case, tmp_path)


def frame(message: dict) -> bytes:
    body = json.dumps(message).encode()
    return b"Content-Length: %d\r\n\r\n%s" % (len(body), body)


def exits_within(process: subprocess.Popen, seconds: float) -> bool:
    try:
        process.wait(seconds)
        return True
    except subprocess.TimeoutExpired:
        process.kill()
        return False


def started(process_id: int | None) -> subprocess.Popen:
    """The scripted server, initialized, in the middle of a 60 s model load."""
    server = subprocess.Popen([sys.executable, "-m", "tests.lsp.scripted", "--load-s", "60"], cwd=ROOT,
                              stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    server.stdin.write(frame({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                              "params": {"processId": process_id, "capabilities": {}, "rootUri": None}}))
    server.stdin.write(frame({"jsonrpc": "2.0", "method": "initialized", "params": {}}))
    server.stdin.flush()
    return server


def test_the_server_ends_when_the_editor_closes_its_pipe_mid_load():
    server = started(None)
    time.sleep(1.5)
    server.stdin.close()  # the editor went: no shutdown, no exit
    assert exits_within(server, 10), "the model load kept the server alive"


def test_the_server_ends_when_the_editor_process_is_gone():
    editor_process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    server = started(editor_process.pid)
    time.sleep(1.5)
    editor_process.kill()
    editor_process.wait()
    assert exits_within(server, 10), "the server outlived the editor that started it"


def test_the_log_reaches_the_editor_at_its_level(tmp_path):
    async def case(ed: Editor) -> None:
        future = asyncio.get_running_loop().create_future()
        ed.client.protocol._request_futures["bad-1"] = future
        ed.client.protocol._send_data({"jsonrpc": "2.0", "id": "bad-1", "method": types.TEXT_DOCUMENT_INLINE_COMPLETION,
                                       "params": {"textDocument": {"uri": "file:///x.py"},
                                                  "position": {"line": -1, "character": 0}}})
        from pygls.exceptions import JsonRpcException

        with pytest.raises(JsonRpcException):  # answered with InvalidParams
            await asyncio.wait_for(future, ANSWER_S)
        for _ in range(100):
            if any(kind == types.MessageType.Warning and "invalid params" in text for kind, text in ed.client.logs):
                return
            await asyncio.sleep(0.02)
        raise AssertionError(ed.client.logs)

    run(case, tmp_path)


def test_a_request_after_shutdown_is_answered_invalid_request(tmp_path):
    """LSP: once `shutdown` is answered, any other request gets InvalidRequest (pygls
    dropped them unanswered, and an editor waits for each)."""
    from pygls.exceptions import JsonRpcException

    async def case(ed: Editor) -> None:
        text = f"def f(a):\n    {script('    return a')}\n    "
        uri = ed.open("late.py", text)
        await ed.client.shutdown_async(None)
        with pytest.raises(JsonRpcException) as refused:
            await ed.ask(uri, text, len(text))
        assert refused.value.code == -32600 and "after shutdown" in str(refused.value), refused.value

    run(case, tmp_path)


def test_the_last_status_after_indexing_is_ready(tmp_path):
    """A backend that reports its progress on the event loop's own thread (the scripted
    one, `--server` against an engine) hands those reports over after its indexing ends:
    they must not follow "ready" with an "indexing" status the editor then shows."""
    async def case(ed: Editor) -> None:
        await asyncio.sleep(0.5)  # any late report has been sent by now
        states = [state for state, _ in ed.statuses]
        assert "indexing" in states and states[-1] == "ready", ed.statuses

    run(case, tmp_path, options={"indexWorkspace": True})
