"""`codespec lsp --server URL`: the language server's HTTP backend against a live server."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request

import pytest

from codespec.lsp.backend import FimRequest
from codespec.lsp.http_backend import BackendError, HttpBackend

pytestmark = pytest.mark.model
PREFIX = "def fibonacci(n):\n    "
SUFFIX = "\n\nprint(fibonacci(10))\n"


def test_completions_stream_and_stop_when_told(live_server):
    backend = HttpBackend(live_server)
    seen: list[str] = []
    request = FimRequest(PREFIX, SUFFIX, max_tokens=24)
    text = asyncio.run(backend.complete(request, on_text=lambda t: not seen.append(t)))
    assert text.strip() and seen and seen[-1] == text  # streamed, growing
    stopped: list[str] = []
    short = asyncio.run(backend.complete(FimRequest(PREFIX, SUFFIX, max_tokens=48),
                                         on_text=lambda t: stopped.append(t) or False))
    assert len(stopped) == 1 and short == stopped[0]  # the first chunk said stop: reading ended


def test_buffers_and_acceptance_reach_the_server(live_server):
    backend = HttpBackend(live_server)
    before = json.load(urllib.request.urlopen(live_server + "/v1/index/stats"))["dynamic"]["live_tokens"]
    backend.update_document("pkg/new_module.py", "def brand_new():\n    return 42\n" * 5)
    backend.record_acceptance(True)
    for _ in range(100):  # both are sent from background threads
        stats = json.load(urllib.request.urlopen(live_server + "/v1/index/stats"))
        metrics = urllib.request.urlopen(live_server + "/metrics").read().decode()
        if stats["dynamic"]["live_tokens"] > before and 'outcome="accepted"' in metrics:
            break
        time.sleep(0.05)
    assert stats["dynamic"]["live_tokens"] > before
    assert 'codespec_lsp_completions_total{outcome="accepted"} 1.0' in metrics


def test_an_unreachable_server_is_one_clear_error():
    backend = HttpBackend("http://127.0.0.1:9")  # discard port: nothing listens
    with pytest.raises(BackendError, match="cannot reach codespec serve at http://127.0.0.1:9"):
        asyncio.run(backend.complete(FimRequest("x", "", 4), on_text=lambda t: True))


def test_a_next_edit_comes_from_the_served_route(live_server):
    from codespec.nextedit.history import Change
    from codespec.nextedit.prompt import NextEditRequest

    before = "def area(width, height):\n    return width * height\n"
    after = before.replace("area(width,", "area(w,")
    asked = NextEditRequest("area.py", after, 10, [Change("area.py", 0, before.splitlines(True)[0],
                                                          after.splitlines(True)[0])])
    edits = asyncio.run(HttpBackend(live_server).next_edit(asked))
    assert all(0 <= e.start <= e.end <= len(after) for e in edits)
