"""Prefilling ahead: once the person pauses, the language server hands
the backend the prompt of the request most likely to come, and the request then finds
its chunks in the KV cache."""

from __future__ import annotations

import asyncio
from pathlib import Path

from lsprotocol import types
from pygls.lsp.client import LanguageClient

from codespec.lsp import ahead as ahead_module
from codespec.lsp.ahead import Ahead
from codespec.lsp.options import LspOptions
from tests.lsp.test_replay import answered, ask, tiny_lsp


def test_the_prompt_sent_ahead_is_at_the_last_edit_after_a_pause(monkeypatch):
    monkeypatch.setattr(ahead_module, "IDLE_S", 0.05)
    docs = {"u": ("def f():\n    return 1\n", "f.py", ())}
    sent = []
    options = LspOptions(fim_layout="psm")
    ahead = Ahead(lambda uri, request: sent.append((uri, request)), docs.get, lambda: options)

    async def scenario():
        nonlocal options
        options = LspOptions(fim_layout="spm")
        ahead.changed("u")  # opened, never asked about, the text after the cursor first: no guess pays
        await asyncio.sleep(0.2)
        assert sent == []
        options = LspOptions(fim_layout="psm")
        ahead.changed("u")  # the file's start leads the prompt: the cursor is taken at the end
        await asyncio.sleep(0.2)
        assert sent[-1][0] == "u" and sent[-1][1].prefix == "def f():\n    return 1\n"
        docs["u"] = ("def f():\n    x = 2\n    return 1\n", "f.py", ())
        ahead.changed("u")
        ahead.changed("u")  # a burst of changes: one prompt, after the pause
        await asyncio.sleep(0.2)
        assert len(sent) == 2
        request = sent[-1][1]  # the edit ends before "return": the cursor is there
        assert request.prefix == "def f():\n    x = 2\n" and request.suffix == "return 1\n"
        ahead.changed("u")
        ahead.asked("u", docs["u"][0], 9)  # a request came: its own prefill does the work
        await asyncio.sleep(0.2)
        assert len(sent) == 2
        ahead.closed("u")
        assert sent[-1] == ("u", None)
        ahead.changed("u")  # reopened: where the last request was
        await asyncio.sleep(0.2)
        assert sent[-1][1].prefix == "def f():\n" and sent[-1][1].middle == ""
        ahead.closed("u")
        ahead.cursors.clear()  # a file never asked about, with other files' code: its head pays
        options = LspOptions(fim_layout="spm")
        docs["u"] = (*docs["u"][:2], ("other",))
        ahead.changed("u")
        await asyncio.sleep(0.2)
        assert sent[-1][1] is not None and sent[-1][1].extra == ("other",)

    asyncio.run(scenario())


def test_a_request_after_a_pause_finds_its_prompt_prefilled(tmp_path):
    asyncio.run(_session(tmp_path))


async def _stats(client: LanguageClient) -> dict:
    return await client.protocol.send_request_async("codespec/stats", {})


def _get(value, *keys):
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else getattr(value, key)
    return value


async def _session(tmp_path: Path) -> None:
    options = {"maxTokens": 8, "latencyBudgetMs": 0, "indexWorkspace": False, "prefixTokens": 1024}  # 3+ chunks
    async with tiny_lsp(tmp_path, options) as client:
        uri = (tmp_path / "long.py").as_uri()
        text = "".join(f"def f{i}(x):\n    return x * {i}\n\n" for i in range(40))  # ~1.2k byte tokens
        client.text_document_did_open(types.DidOpenTextDocumentParams(
            types.TextDocumentItem(uri=uri, language_id="python", version=1, text=text)))
        assert not isinstance(await answered(ask(client, uri, 3, 0)), Exception)  # where the person is
        text += "def g(y):\n    return y + 1\n\n"  # they write on at the end, then pause
        client.text_document_did_change(types.DidChangeTextDocumentParams(
            types.VersionedTextDocumentIdentifier(uri=uri, version=2),
            [types.TextDocumentContentChangeWholeDocument(text=text)]))
        seen = []
        for _ in range(600):  # the idle server prefills the prompt at the end of that edit, to its end
            stats = await _stats(client)
            seen.append(_get(stats, "backend", "prefilled_ahead", "tokens"))
            if len(seen) > 10 and seen[-1] >= 800 and seen[-1] == seen[-10]:
                break
            await asyncio.sleep(0.1)
        assert seen[-1] >= 800, stats
        result = await answered(ask(client, uri, text.count("\n"), 0))
        assert not isinstance(result, Exception), result
        last = _get(await _stats(client), "backend", "prompt_cache", "last")
        prompt, cached = _get(last, "prompt_tokens"), _get(last, "cached_tokens")
        # computed ahead: every whole pass short of the last token (three chunks, the last
        # chunk's sub-chunks), or every token but the last where a prefill row is a decode
        # step (the C row decoder: Forward.prefill_exact)
        whole_passes = 768 + (prompt - 1 - 768) // 32 * 32
        assert cached == whole_passes == seen[-1] or (cached == prompt - 1 and seen[-1] >= whole_passes), \
            (prompt, cached, seen[-1])
