"""A memory probe, as a test: the real `codespec lsp` on the default model, a
5 MB document changed 500 times (whole-text changes, as the probe's client sent them).
Twenty such changes used to take the process from 2.8 GB to 11.8 GB, a thread per
change. The bar: memory within 1 GB of its start, threads bounded, the server still
answering. Slow (~5 min here): CI's slow step."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
from lsprotocol import types
from pygls.lsp.client import LanguageClient

from codespec.bench.editor import stop_client
from tests.lsp.test_replay import ready_event, answered, ask, threads

pytestmark = [pytest.mark.slow, pytest.mark.model,
              pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")]

CHANGES = 500


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_a_500_change_storm_on_a_5mb_document_keeps_memory_and_threads_flat(tmp_path):
    asyncio.run(_storm(tmp_path))


async def _storm(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    line = "def handler_{i}(event, context):\n    return {{'status': {i}, 'body': event.get('body')}}\n\n"
    text = "".join(line.format(i=i) for i in range(5 * 1024 * 1024 // len(line.format(i=0))))
    doc = root / "big.py"
    doc.write_text(text)
    client = LanguageClient("storm", "1")
    ready = ready_event(client)

    await client.start_io(sys.executable, "-m", "codespec", "lsp")
    try:
        await client.initialize_async(types.InitializeParams(
            capabilities=types.ClientCapabilities(), workspace_folders=[types.WorkspaceFolder(root.as_uri(), "ws")],
            initialization_options={"maxTokens": 16}))
        client.initialized(types.InitializedParams())
        await asyncio.wait_for(ready.wait(), 600)
        pid = client._server.pid
        uri = doc.as_uri()
        client.text_document_did_open(types.DidOpenTextDocumentParams(
            types.TextDocumentItem(uri=uri, language_id="python", version=1, text=text)))
        await answered(ask(client, uri, 3, 0))  # the document is in, and the model warm
        start_rss, start_threads = rss_mb(pid), threads(pid)
        peak = [start_rss, start_threads]

        async def watch() -> None:
            while True:
                peak[0], peak[1] = max(peak[0], rss_mb(pid)), max(peak[1], threads(pid))
                await asyncio.sleep(0.2)

        watcher = asyncio.ensure_future(watch())
        for version in range(2, CHANGES + 2):
            text += f"x{version} = {version}\n"
            client.text_document_did_change(types.DidChangeTextDocumentParams(
                types.VersionedTextDocumentIdentifier(uri=uri, version=version),
                [types.TextDocumentContentChangeWholeDocument(text=text)]))
            if version % 50 == 0:
                await asyncio.sleep(0)  # let the frames go out
        result = await answered(ask(client, uri, text.count("\n"), 0))
        await asyncio.sleep(2)  # the last change settles into the index
        watcher.cancel()
        print(f"\nstorm: RSS {start_rss:.0f} MB at start, peak {peak[0]:.0f} MB, end {rss_mb(pid):.0f} MB; "
              f"threads {start_threads} at start, peak {peak[1]}")
        assert not isinstance(result, Exception), result
        assert peak[0] - start_rss < 1024, (start_rss, peak[0])
        assert peak[1] <= start_threads + 4, (start_threads, peak[1])
        await client.shutdown_async(None)
        client.exit(None)
    finally:
        await stop_client(client)
