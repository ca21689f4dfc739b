"""`codespec lsp --server` with no server behind it: clear status, no crash, no completions."""

from __future__ import annotations

import asyncio
import sys
from types import SimpleNamespace

import pytest
import pytest_lsp
from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient

from tests.lsp.test_server import capabilities, open_file, request

NOWHERE = "http://127.0.0.1:9"  # the discard port: nothing listens


@pytest_lsp.fixture(scope="module", config=ClientServerConfig(
    server_command=[sys.executable, "-m", "codespec", "lsp", "--server", NOWHERE]))
async def client(lsp_client: LanguageClient, tmp_path_factory):
    root = tmp_path_factory.mktemp("nowhere")
    (root / "json").mkdir()
    statuses: list[str] = []

    @lsp_client.feature("codespec/status")
    def on_status(params) -> None:
        state = params.get("state") if isinstance(params, dict) else getattr(params, "state", "")
        message = params.get("message") if isinstance(params, dict) else getattr(params, "message", "")
        statuses.append(f"{state}: {message}")

    await lsp_client.initialize_session(types.InitializeParams(
        capabilities=capabilities("visual-studio-code"),
        workspace_folders=[types.WorkspaceFolder(uri=root.as_uri(), name="nowhere")],
    ))
    lsp_client.ctx = SimpleNamespace(root=root, statuses=statuses)
    yield
    await lsp_client.shutdown_session()


@pytest.mark.asyncio(loop_scope="module")
async def test_an_unreachable_server_is_reported_and_the_editor_keeps_working(client):
    for _ in range(200):
        if any(s.startswith("error") for s in client.ctx.statuses):
            break
        await asyncio.sleep(0.05)
    assert any("cannot reach the engine at http://127.0.0.1:9" in s for s in client.ctx.statuses), \
        client.ctx.statuses
    text = "def add(a, b):\n    \n"
    uri = open_file(client, client.ctx.root, text)
    assert await request(client, uri, 1, 4) is None  # no completion, no error response
    assert client.ctx.statuses[-1].startswith("error: cannot reach"), client.ctx.statuses
    assert client.error is None
