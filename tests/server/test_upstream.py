"""`codespec serve --upstream URL` and `codespec lsp --server URL` against a live
OpenAI-compatible engine: here another codespec serve on a loopback socket (the real
default model), driven through its `/v1/completions` with token-id prompts, the way
they drive vLLM and SGLang (tests/integrations/test_vllm_engine.py does, with vLLM)."""

from __future__ import annotations

import asyncio
import json

import pytest

from codespec.cli.lsp import remote_backend
from codespec.engine.run import GenerationConfig
from codespec.errors import CodespecError
from codespec.integrations.upstream import UpstreamClient, UpstreamError
from codespec.lsp.backend import FimRequest
from codespec.lsp.engine_backend import EngineBackend
from codespec.lsp.http_backend import HttpBackend
from codespec.landing.cut import Landing, infill_mode
from codespec.landing.lines import HeldSpace
from codespec.prompts import fim_ids
from codespec.server.app import create_app, load_backend
from codespec.server.upstream_backend import UpstreamBackend
from codespec.settings import Settings

pytestmark = pytest.mark.model
PREFIX = "def fibonacci(n):\n    "
SUFFIX = "\n\nprint(fibonacci(10))\n"


@pytest.fixture(scope="module")
def front(live_server, default_model):
    settings = Settings(max_tokens_limit=512, upstream=live_server)
    up = UpstreamBackend.connect(live_server, default_model.tokenizer, settings)
    return create_app(settings, backend=up), up


@pytest.fixture
async def front_http(front):
    import httpx2

    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=front[0]), base_url="http://front",
                                  timeout=120) as http:
        yield http


@pytest.mark.anyio
async def test_infill_through_the_front_is_the_engines_own_greedy_output(front_http, backend, default_model):
    # the prefix's trailing spaces are held back from the prompt, the content starts after them
    before, held = HeldSpace.split(PREFIX)
    ids = fim_ids(default_model.tokenizer, before, SUFFIX, layout="psm")
    direct = await backend.complete(ids, GenerationConfig(max_new_tokens=24))
    document = PREFIX + SUFFIX  # the content is cut for where it lands (landing/cut.py), as codespec's own is
    expected = Landing.at(document, len(PREFIX), "", infill_mode(document, len(PREFIX))).trim(held.heal(direct.text))
    body = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 24, "fim_layout": "psm"}
    answer = (await front_http.post("/infill", json=body)).json()
    assert expected and answer["content"] == expected and answer["tokens_predicted"] == 24
    streamed = await front_http.post("/infill", json={**body, "stream": True})
    pieces = [line for line in streamed.text.splitlines() if line.startswith("data:")]
    assert len(pieces) > 2 and '"stop": true' in pieces[-1]
    assert "".join(json.loads(p[5:])["content"] for p in pieces) == expected


@pytest.mark.anyio
async def test_openai_routes_health_metrics_and_the_index_answer(front_http, live_server):
    completion = (await front_http.post("/v1/completions", json={"prompt": "def add(a, b):", "max_tokens": 8,
                                                                 "stop": ["\n\n"]})).json()
    assert completion["choices"][0]["text"] and completion["usage"]["completion_tokens"] >= 1
    health = (await front_http.get("/health")).json()
    assert health["upstream"] == live_server and health["status"] == "ok"
    refused = await front_http.post("/v1/index/documents", json={"key": "file:a.py", "text": "x = 1\n"})
    assert refused.status_code == 400 and "docs/scale.md" in refused.json()["error"]["message"]
    assert (await front_http.get("/v1/index/stats")).json()["static"] is None
    metrics = (await front_http.get("/metrics")).text
    assert "codespec_generated_tokens_total" in metrics and "codespec_generated_tokens_total 0.0" not in metrics


@pytest.mark.anyio
async def test_the_engine_refusing_a_request_is_the_clients_error(front_http):
    answer = await front_http.post("/v1/completions", json={"prompt": [1, 2, 3], "suffix": "x", "max_tokens": 4})
    assert answer.status_code == 400 and "suffix needs a text prompt" in answer.json()["error"]["message"]
    # a token id outside the vocabulary: the engine answers 400, the front says so with 400
    outside = await front_http.post("/v1/completions", json={"prompt": [151_999], "max_tokens": 4})
    assert outside.status_code == 400 and "the engine refused" in outside.json()["error"]["message"]
    assert "outside the model's vocabulary" in outside.json()["error"]["message"]
    logprobs = await front_http.post("/v1/completions", json={"prompt": "x", "max_tokens": 2, "logprobs": 1})
    assert logprobs.status_code == 400 and "not served through --upstream" in logprobs.json()["error"]["message"]


def test_lsp_against_an_engine_builds_fim_with_its_tokens(live_server, default_model, backend):
    client = UpstreamClient(live_server)
    engine = EngineBackend(client, default_model.tokenizer, client.served_model(), "instruct")
    # as the language server builds it (lsp/window.py): the prefix ends at a line start
    # (the typed part of the line, its spaces held back, would be the middle)
    request = FimRequest(PREFIX.rstrip(" "), SUFFIX, max_tokens=24)
    seen: list[str] = []
    text = asyncio.run(engine.complete(request, on_text=lambda t: not seen.append(t)))
    via_infill = asyncio.run(HttpBackend(live_server).complete(request, on_text=lambda t: True))
    # /infill serves the same text cut for where it lands (the language server cuts it so too)
    document = request.prefix + SUFFIX
    landing = Landing.at(document, len(request.prefix), "", infill_mode(document, len(request.prefix)))
    assert landing.trim(text) == via_infill and seen[-1] == text
    stopped: list[str] = []
    first = asyncio.run(engine.complete(request, on_text=lambda t: stopped.append(t) or False))
    assert len(stopped) == 1 and first == stopped[0]


def test_lsp_server_picks_the_client_by_what_the_url_serves(live_server):
    assert isinstance(remote_backend(live_server, Settings()), HttpBackend)  # codespec serve: /infill


def test_an_unreachable_engine_or_a_bad_combination_is_one_clear_error():
    with pytest.raises(UpstreamError, match="cannot reach the engine at http://127.0.0.1:9"):
        load_backend(Settings(upstream="http://127.0.0.1:9"))
    with pytest.raises(CodespecError, match="drafts from its own index"):
        load_backend(Settings(upstream="http://127.0.0.1:9", index="repo.csidx"))
    with pytest.raises(UpstreamError, match="give the engine's URL"):
        UpstreamClient("127.0.0.1:8000")


def test_an_editor_started_before_its_server_recovers_when_it_answers(live_server):
    from codespec.lsp.remote_backend import RemoteBackend

    attempts: list[int] = []

    def resolve():
        attempts.append(1)
        if len(attempts) == 1:  # the server is not up yet
            return remote_backend("http://127.0.0.1:9", Settings())
        return remote_backend(live_server, Settings())

    remote = RemoteBackend(resolve)
    request = FimRequest(PREFIX, SUFFIX, max_tokens=8)
    remote.update_document("a.py", "x = 1\n")  # nothing to send to yet: dropped, no error
    with pytest.raises(UpstreamError, match="cannot reach"):
        asyncio.run(remote.complete(request, on_text=lambda t: True))
    assert asyncio.run(remote.complete(request, on_text=lambda t: True)).strip()
    assert isinstance(remote.resolved(), HttpBackend) and len(attempts) == 2
