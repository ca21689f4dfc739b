"""`codespec lsp` driven by pytest-lsp as a real client, with VS Code's and Neovim's
capability profiles (plus LSP 3.18 inline completion), on the embedded default model."""

from __future__ import annotations

import ast
import asyncio
import sys
from types import SimpleNamespace

import pytest
import pytest_lsp
from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient, client_capabilities

from tests.lsp.conftest import CUT_FILE, make_repo

pytestmark = pytest.mark.model
SERVER = [sys.executable, "-m", "codespec", "lsp"]
READY_TIMEOUT_S = 300  # model load, calibration and indexing


def capabilities(profile: str) -> types.ClientCapabilities:
    caps = client_capabilities(profile)
    caps.text_document.inline_completion = types.InlineCompletionClientCapabilities()
    caps.window.work_done_progress = True
    return caps


async def start(client: LanguageClient, root, profile: str, options: dict) -> list[dict]:
    statuses: list[dict] = []
    ready = asyncio.Event()

    @client.feature("codespec/status")
    def on_status(params) -> None:
        def field(name: str) -> str:
            return params.get(name, "") if isinstance(params, dict) else getattr(params, name, "")

        statuses.append({"state": field("state"), "message": field("message")})
        if statuses[-1]["state"] in ("ready", "error"):
            ready.set()

    await client.initialize_session(types.InitializeParams(
        capabilities=capabilities(profile),
        workspace_folders=[types.WorkspaceFolder(uri=root.as_uri(), name="workspace")],
        initialization_options=options,
    ))
    await asyncio.wait_for(ready.wait(), READY_TIMEOUT_S)
    return statuses


def open_file(client: LanguageClient, root, text: str) -> str:
    uri = (root / CUT_FILE).as_uri()
    client.text_document_did_open(types.DidOpenTextDocumentParams(
        text_document=types.TextDocumentItem(uri=uri, language_id="python", version=1, text=text)))
    return uri


def request(client: LanguageClient, uri: str, line: int, character: int):
    return client.text_document_inline_completion_async(types.InlineCompletionParams(
        text_document=types.TextDocumentIdentifier(uri=uri),
        position=types.Position(line=line, character=character),
        context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Automatic),
    ))


@pytest_lsp.fixture(scope="module", config=ClientServerConfig(server_command=SERVER))
async def vscode(lsp_client: LanguageClient, tmp_path_factory):
    root, text, body_line = make_repo(tmp_path_factory.mktemp("vscode"))
    statuses = await start(lsp_client, root, "visual-studio-code", {"maxTokens": 256})
    # pytest-lsp hands the tests the client itself: the workspace rides along on it
    lsp_client.ctx = SimpleNamespace(root=root, text=text, body_line=body_line, statuses=statuses)
    yield
    await lsp_client.shutdown_session()


@pytest.mark.asyncio(loop_scope="module")
async def test_indexing_reports_progress_and_status(vscode):
    client, statuses = vscode, vscode.ctx.statuses
    # the model's load is announced (an editor shows a spinner, not "off"), then the indexing
    assert statuses[0] == {"state": "busy", "message": "loading the model"}, statuses
    assert statuses[1]["state"] == "indexing" and statuses[-1]["state"] == "ready", statuses
    assert "files" in statuses[-1]["message"]
    reports = [r for token_reports in client.progress_reports.values() for r in token_reports]
    kinds = [r.kind for r in reports]
    assert kinds[0] == "begin" and kinds[-1] == "end" and "report" in kinds, kinds


@pytest.mark.asyncio(loop_scope="module")
async def test_completion_at_a_function_body_ends_at_the_block_end(vscode):
    client, root, text, body_line = vscode, vscode.ctx.root, vscode.ctx.text, vscode.ctx.body_line
    uri = open_file(client, root, text)
    result = await request(client, uri, body_line, 8)
    assert result is not None and result.items, "no completion at the start of a function body"
    completion = result.items[0].insert_text
    lines = completion.splitlines()
    assert lines and lines[0].strip(), completion
    # it ends at the block end: no line leaves the method's body (8 spaces), and the
    # last statement is complete (the model went on to the next method, which was cut)
    assert all(not line.strip() or len(line) - len(line.lstrip()) >= 8 for line in lines[1:]), completion
    try:  # complete code: the last statement was not cut
        ast.parse("class C:\n    def decode(self, s, _w=None):\n        " + completion)
    except SyntaxError as exc:  # the model's own mistake (its greedy text varies with the CPU's kernels) is
        # not the server's; a statement cut mid-way is
        assert not any(cut in exc.msg for cut in ("never closed", "unexpected EOF", "expected an indented block")), \
            f"{exc.msg}: {completion}"
    command = result.items[0].command
    # the command carries a short key, never a copy of the document (megabytes per keystroke in big files)
    assert command.command == "codespec.accepted" and len(command.arguments) == 1 and len(command.arguments[0]) < 16
    # the editor accepts: the text changes and the command runs (the server computes the next one ahead)
    cursor = sum(len(line) + 1 for line in text.split("\n")[:body_line]) + 8
    accepted = text[:cursor] + completion + text[cursor:]
    client.text_document_did_change(types.DidChangeTextDocumentParams(
        text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=2),
        content_changes=[types.TextDocumentContentChangeWholeDocument(text=accepted)]))
    await client.workspace_execute_command_async(types.ExecuteCommandParams(command=command.command,
                                                                            arguments=command.arguments))
    client.text_document_did_save(types.DidSaveTextDocumentParams(text_document=types.TextDocumentIdentifier(uri)))


@pytest.mark.asyncio(loop_scope="module")
async def test_a_newer_request_cancels_the_older_one(vscode):
    client, root, text, body_line = vscode, vscode.ctx.root, vscode.ctx.text, vscode.ctx.body_line
    edited = text.replace("        \n", "        obj, end = \n", 1)
    uri = (root / CUT_FILE).as_uri()
    client.text_document_did_change(types.DidChangeTextDocumentParams(
        text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=3),
        content_changes=[types.TextDocumentContentChangeWholeDocument(text=edited)]))
    older = asyncio.ensure_future(request(client, uri, body_line, 19))  # sent now
    await asyncio.sleep(0.02)
    newer = asyncio.ensure_future(request(client, uri, body_line, 19))
    outcome = (await asyncio.gather(older, return_exceptions=True))[0]
    assert isinstance(outcome, Exception) or outcome is None, outcome  # superseded
    result = await newer
    assert result is not None and result.items and result.items[0].insert_text.strip()


@pytest_lsp.fixture(scope="module", config=ClientServerConfig(server_command=SERVER))
async def neovim(lsp_client: LanguageClient, tmp_path_factory):
    root, text, body_line = make_repo(tmp_path_factory.mktemp("neovim"))
    options = {"maxTokens": "lots", "debounceMs": -1, "indexWorkspace": False, "multiline": False}
    await start(lsp_client, root, "neovim", options)
    lsp_client.ctx = SimpleNamespace(root=root, text=text, body_line=body_line,
                                     messages=[m.message for m in lsp_client.messages])
    yield
    await lsp_client.shutdown_session()


@pytest.mark.asyncio(loop_scope="module")
async def test_bad_configuration_is_reported_and_defaults_serve(neovim):
    client, root, text, body_line = neovim, neovim.ctx.root, neovim.ctx.text, neovim.ctx.body_line
    messages = neovim.ctx.messages
    assert any("maxTokens" in m for m in messages) and any("debounceMs" in m for m in messages), messages
    uri = open_file(client, root, text)
    result = await request(client, uri, body_line, 8)
    assert result is not None and result.items
    assert "\n" not in result.items[0].insert_text  # multiline off: one line
    signature = text[: text.index("    def decode(self")].count("\n")
    assert (await request(client, uri, signature, 10)) is None  # "de|code": mid-word, nothing


@pytest.mark.asyncio(loop_scope="module")
async def test_a_next_edit_after_a_rename_comes_from_the_model(vscode):
    """textDocument/copilotInlineEdit on the in-process model: the rename reaches the edit
    history through didChange, and the answer's edits lie in the document (the 0.5B may
    propose none: the text is the model's)."""
    client, root = vscode, vscode.ctx.root
    before = "def area(width, height):\n    check(width)\n    return width * height\n"
    uri = (root / "area.py").as_uri()
    client.text_document_did_open(types.DidOpenTextDocumentParams(
        text_document=types.TextDocumentItem(uri=uri, language_id="python", version=1, text=before)))
    client.text_document_did_change(types.DidChangeTextDocumentParams(
        types.VersionedTextDocumentIdentifier(uri=uri, version=2),
        [types.TextDocumentContentChangeWholeDocument(text=before.replace("area(width,", "area(w,"))]))
    params = {"textDocument": {"uri": uri, "version": 2}, "position": {"line": 0, "character": 10}}
    answer = await asyncio.wait_for(client.protocol.send_request_async("textDocument/copilotInlineEdit", params), 120)
    edits = answer["edits"] if isinstance(answer, dict) else answer.edits
    for edit in edits:
        edit = edit if isinstance(edit, dict) else {"range": {"end": {"line": edit.range.end.line}}}
        assert edit["range"]["end"]["line"] <= 3
