"""Cross-file context: code from the files the person left, before the file's
own window, in the repository layout; it changes when the person switches files, never
while they type in one."""

from __future__ import annotations

import asyncio
from pathlib import Path

from lsprotocol import types
from pygls.lsp.client import LanguageClient

from codespec.lsp.context import CHUNK_LINES, Ring
from codespec.prompts import ExtraFile, fim_ids
from tests.lsp.test_replay import answered, ask, tiny_lsp
from tests.lsp.tiny_fim import tiny_fim_model


def test_the_ring_keeps_the_lines_around_where_the_person_was_newest_last():
    ring = Ring()
    text = "".join(f"line {i}\n" for i in range(200))
    ring.left("a.py", text, text.index("line 100"))
    ring.left("b.py", "def g():\n    return 2\n", 0)
    ring.left("a.py", text, text.index("line 150"))  # a file left again: its chunk moves to the end
    chunks = ring.context("c.py", 10_000)
    assert [c.filename for c in chunks] == ["b.py", "a.py"]
    assert chunks[1].text.startswith("line 120\n") and chunks[1].text.count("\n") == CHUNK_LINES
    assert [c.filename for c in ring.context("a.py", 10_000)] == ["b.py"]  # not the file being written
    assert [c.filename for c in ring.context("c.py", 95)] == ["a.py"]  # the newest that fit


def test_the_prompt_names_the_files_and_the_file_being_written(tmp_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_fim_model(tmp_path / "model"))
    ids = fim_ids(tokenizer, "x = ", "\n", extra=[ExtraFile("a.py", "y = 1\n")], path="pkg/b.py")
    text = tokenizer.decode(ids)
    assert text == "<|repo_name|>repository\n<|file_sep|>a.py\ny = 1\n<|file_sep|>pkg/b.py\n" \
                   "<|fim_prefix|>x = <|fim_suffix|>\n<|fim_middle|>"
    spm = tokenizer.decode(fim_ids(tokenizer, "x = ", "\n", "y", layout="spm"))
    assert spm == "<|fim_prefix|><|fim_suffix|>\n<|fim_middle|>x = y"  # the FIM paper's SPM


def test_a_request_after_a_switch_carries_the_file_left(tmp_path):
    asyncio.run(_session(tmp_path))


async def _last_prompt(client: LanguageClient) -> int:
    stats = await client.protocol.send_request_async("codespec/stats", {})
    return stats.backend.prompt_cache.last.prompt_tokens


async def _session(tmp_path: Path) -> None:
    options = {"maxTokens": 4, "latencyBudgetMs": 0, "indexWorkspace": False, "debounceMs": 0}
    async with tiny_lsp(tmp_path, options) as client:
        a, b = (tmp_path / "a.py").as_uri(), (tmp_path / "b.py").as_uri()
        left = "def helper(values):\n    return sorted(values)\n"
        for uri, text in ((a, left), (b, "import a\n\n\ndef main():\n    \n")):
            client.text_document_did_open(types.DidOpenTextDocumentParams(
                types.TextDocumentItem(uri=uri, language_id="python", version=1, text=text)))
        await answered(ask(client, a, 1, 4))
        await answered(ask(client, b, 4, 4))
        alone = await _last_prompt(client)
        client.workspace_did_change_configuration(types.DidChangeConfigurationParams(
            settings={"codespec": {**options, "contextTokens": 256}}))
        await answered(ask(client, b, 4, 3))
        with_context = await _last_prompt(client)
        # a.py's chunk (its two lines, byte tokens), the repository and file markers and names
        assert with_context - alone >= len(left) + len("a.py\nb.py\nrepository\n"), (alone, with_context)
