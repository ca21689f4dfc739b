"""The HTTP endpoint with real clients: openai (in process and over loopback), llama.vim's
/infill, streaming, concurrency, disconnects, and every bad input getting a 4xx."""

from __future__ import annotations

import asyncio

import pytest

from codespec.engine.run import GenerationConfig

pytestmark = [pytest.mark.model, pytest.mark.anyio]

PROMPT = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"


def expected_text(backend, prompt: str, max_tokens: int) -> str:
    ids = backend.tokenizer(prompt, add_special_tokens=False)["input_ids"]
    return backend.engine.generate(ids, GenerationConfig(max_new_tokens=max_tokens, speculate=False)).text


async def test_completion_and_stream_with_the_openai_client(client, backend):
    want = expected_text(backend, PROMPT, 24)
    out = await client.completions.create(model="codespec", prompt=PROMPT, max_tokens=24)
    assert out.choices[0].text == want
    assert out.usage.completion_tokens == 24 and out.choices[0].finish_reason == "length"
    pieces = []
    stream = await client.completions.create(model="codespec", prompt=PROMPT, max_tokens=24, stream=True)
    async for event in stream:
        pieces.append(event.choices[0].text)
    assert "".join(pieces) == want and len(pieces) > 2


async def test_seeded_sampling_repeats(client):
    args = dict(model="codespec", prompt=PROMPT, max_tokens=12, temperature=0.8, top_p=0.95, seed=42)
    first = await client.completions.create(**args)
    second = await client.completions.create(**args)
    assert first.choices[0].text == second.choices[0].text


async def test_fim_suffix_and_chat(client):
    out = await client.completions.create(model="codespec", prompt="def add(a, b):\n    ", suffix="\n\nprint(add(1, 2))\n",
                                          max_tokens=12)
    assert "a + b" in out.choices[0].text
    chat = await client.chat.completions.create(
        model="codespec", max_tokens=16, messages=[{"role": "user", "content": "Write a Python hello world."}])
    assert chat.choices[0].message.content and chat.choices[0].message.role == "assistant"
    pieces = []
    stream = await client.chat.completions.create(
        model="codespec", max_tokens=16, stream=True, messages=[{"role": "user", "content": "Write a Python hello world."}])
    async for event in stream:
        pieces.append(event.choices[0].delta.content or "")
    assert "".join(pieces) == chat.choices[0].message.content


async def test_infill_holds_back_the_prefix_spaces_when_nothing_is_typed(http):
    """An /infill whose cursor ends `input_prefix` (no `prompt`, as agents send it) holds
    the line's spaces back as it does a typed part's: the same prompt and content as the
    request that sends the cursor line as `prompt`, in either layout."""
    line = "def fibonacci(n):\n"
    for layout in ("psm", "spm"):
        common = {"input_suffix": "\n\nprint(fibonacci(10))\n", "n_predict": 12, "fim_layout": layout}
        at_end = (await http.post("/infill", json={**common, "input_prefix": line + "    "})).json()
        typed = (await http.post("/infill", json={**common, "input_prefix": line, "prompt": "    "})).json()
        assert at_end["tokens_evaluated"] == typed["tokens_evaluated"]
        assert at_end["content"] == typed["content"], layout


async def test_infill_as_llama_vim_sends_it(http):
    body = {  # the fields llama.vim's llama#fim sends
        "id_slot": 0, "input_prefix": "import os\n\ndef list_python_files(path):\n    ",
        "input_suffix": "\n\nif __name__ == '__main__':\n    print(list_python_files('.'))\n",
        "input_extra": [{"filename": "util.py", "text": "def is_python(name):\n    return name.endswith('.py')\n"},
                        {"filename": "numbers.py",  # a prompt past one prefill chunk (256 tokens): reusable
                         "text": "".join(f"def add_{i}(x):\n    return x + {i}\n\n" for i in range(30))}],
        "prompt": "", "n_predict": 24, "n_indent": 4, "top_k": 40, "top_p": 0.90, "stream": False,
        "samplers": ["top_k", "top_p", "infill"], "cache_prompt": True, "t_max_prompt_ms": 500,
        "t_max_predict_ms": 10000, "response_fields": ["content", "timings/prompt_n", "tokens_cached"],
    }
    r = await http.post("/infill", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    # response_fields: exactly those, the nested one moved to the top under its path
    assert out.keys() == {"content", "timings/prompt_n", "tokens_cached"} and out["content"], out
    assert out["timings/prompt_n"] > 0
    again = (await http.post("/infill", json={**body, "response_fields": None})).json()
    assert again["content"] == out["content"] and again["stop"] is True and again["tokens_predicted"] <= 24
    assert {"prompt_n", "prompt_ms", "prompt_per_token_ms", "prompt_per_second", "predicted_n", "predicted_ms",
            "predicted_per_token_ms", "predicted_per_second"} <= again["timings"].keys()
    # the same prompt again: its KV came from the cache, and the response says so
    assert again["tokens_cached"] > 0 and again["tokens_cached"] + again["timings"]["prompt_n"] == \
        again["tokens_evaluated"]


async def test_a_sliding_line_window_keeps_its_cached_prompt(http):
    """llama.vim sends the N lines before the cursor: past line N each new line moves the
    prefix's start. /infill starts a long prefix at its first anchor line (prompts.
    anchored_prefix), so the next request reads only what changed at the end; with
    `anchor_prefix: false` (codespec lsp's own grid windows) the prefix is taken as given."""
    lines = [f"v{i} = {i}\n" for i in range(260)]
    common = {"input_suffix": "\nprint(v0)\n", "n_predict": 2, "fim_layout": "spm"}

    async def infill(first: int, **extra) -> dict:
        body = {**common, "input_prefix": "".join(lines[first:first + 210]), **extra}
        r = await http.post("/infill", json=body)
        assert r.status_code == 200, r.text
        return r.json()

    await infill(0)
    slid = await infill(1)  # one line typed: the window moved down a line
    assert slid["tokens_evaluated"] - slid["tokens_cached"] < 16, slid
    await infill(2, anchor_prefix=False)
    as_given = await infill(3, anchor_prefix=False)
    assert as_given["tokens_evaluated"] - as_given["tokens_cached"] > 500, as_given


async def test_concurrent_requests_equal_their_sequential_outputs(client, backend):
    prompts = [f"def function_{i}(x):\n    return x * {i}\n\ndef next_{i}(" for i in range(8)]
    want = [expected_text(backend, p, 16) for p in prompts]
    outs = await asyncio.gather(*(client.completions.create(model="codespec", prompt=p, max_tokens=16)
                                  for p in prompts))
    assert [o.choices[0].text for o in outs] == want


async def test_disconnect_mid_stream_frees_the_slot(live_server, backend):
    import httpx2

    async with httpx2.AsyncClient(base_url=live_server, timeout=60) as http:
        async with http.stream("POST", "/v1/completions",
                               json={"prompt": PROMPT, "max_tokens": 400, "stream": True}) as response:
            async for line in response.aiter_lines():
                if line.startswith("data:"):
                    break  # one chunk read, then the client goes away
        for _ in range(600):  # bounded wait for the worker to notice (no timing assertion)
            health = (await http.get("/health")).json()
            if health["active"] == 0:
                break
            await asyncio.sleep(0.05)
        assert health["active"] == 0 and health["waiting"] == 0
        r = await http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 4})
        assert r.status_code == 200


async def test_openai_client_over_a_real_socket(live_server):
    import openai

    async with openai.AsyncOpenAI(base_url=f"{live_server}/v1", api_key="unused", max_retries=0) as client:
        stream = await client.completions.create(model="codespec", prompt=PROMPT, max_tokens=8, stream=True)
        text = "".join([e.choices[0].text async for e in stream])
        models = await client.models.list()
    assert text
    assert [m.id for m in models.data] == ["Qwen2.5-Coder-0.5B-Instruct"]


BAD = [
    ("post", "/v1/completions", b"{not json", 400, "not valid JSON at character 1: Expecting property name"),
    ("post", "/v1/completions", {"prompt": 5, "max_tokens": 4}, 400, "prompt"),
    ("post", "/v1/completions", {"prompt": "x", "max_tokens": -1}, 400, "max_tokens"),
    ("post", "/v1/completions", {"prompt": "x", "max_tokens": 100000}, 400, "limit"),
    ("post", "/v1/completions", {"prompt": "x", "model": "gpt-9"}, 404, "does not exist"),
    ("post", "/v1/completions", {"prompt": "x", "temperature": 3}, 400, "temperature"),
    ("post", "/v1/completions", {"prompt": "x", "top_p": 0}, 400, "top_p"),
    ("post", "/v1/completions", {"prompt": "x", "n": 2}, 400, "n"),
    ("post", "/v1/completions", {"prompt": ["a", "b"]}, 400, "exactly one prompt"),
    ("post", "/v1/completions", {"prompt": ""}, 400, "empty"),
    ("post", "/v1/completions", {"prompt": "x", "stop": [""]}, 400, "stop"),
    ("post", "/v1/chat/completions", {"messages": []}, 400, "messages"),
    ("post", "/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, 400, "role"),
    ("post", "/infill", {"input_prefix": "x", "n_predict": "many"}, 400, "n_predict"),
    ("post", "/v1/index/documents", {"key": "", "text": "x"}, 400, "key"),
    ("delete", "/v1/index/documents/never-added", None, 404, "no document"),
    ("get", "/v1/nothing-here", None, 404, "Not Found"),
]


@pytest.mark.parametrize("method, path, body, status, message", BAD)
async def test_bad_requests_get_openai_style_4xx(http, method, path, body, status, message):
    if isinstance(body, bytes):
        r = await http.request(method.upper(), path, content=body, headers={"content-type": "application/json"})
    else:
        r = await http.request(method.upper(), path, json=body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert message in error["message"] and error["type"]
    assert (await http.get("/health")).status_code == 200  # still serving


async def test_prompt_longer_than_the_context(http, backend):
    long_prompt = "1" * (backend.engine.max_context + 10)  # one token per digit
    r = await http.post("/v1/completions", json={"prompt": long_prompt, "max_tokens": 4})
    message = r.json()["error"]["message"]
    assert r.status_code == 400 and "context holds" in message and "--kv-slot-tokens" in message


async def test_oversized_body_is_refused(http, backend):
    r = await http.post("/v1/completions", json={"prompt": "x" * (backend.settings.max_request_bytes + 1)})
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"


async def test_index_routes_feed_drafts(http, backend):
    text = "def very_specific_helper(alpha, beta):\n    return alpha * 31 + beta * 17 - 5\n"
    r = await http.post("/v1/index/documents", json={"key": "buffer:helpers.py", "text": text})
    assert r.status_code == 200 and r.json()["tokens"] > 10
    stats = (await http.get("/v1/index/stats")).json()
    assert stats["dynamic"]["documents"] >= 1
    assert (await http.delete("/v1/index/documents/buffer:helpers.py")).json()["removed"] is True


async def test_metrics_expose_speculation(http):
    await http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 8})
    text = (await http.get("/metrics")).text
    for name in ("codespec_requests_total", "codespec_accepted_tokens_per_pass", "codespec_verify_passes_total",
                 "codespec_time_to_first_token_seconds", "codespec_queue_depth", "codespec_index_tokens",
                 "codespec_inter_token_latency_seconds"):
        assert name in text, name


async def test_engine_failure_fails_one_request_only(http, backend, monkeypatch):
    from codespec.engine.engine import Engine

    original = Engine._prefill

    def broken(self, run):
        if run.prompt and run.prompt[-1] == backend.tokenizer.convert_tokens_to_ids("<|fim_pad|>"):
            raise RuntimeError("simulated kernel failure")
        return original(self, run)

    monkeypatch.setattr(Engine, "_prefill", broken)
    r = await http.post("/v1/completions", json={"prompt": "x<|fim_pad|>", "max_tokens": 4})
    assert r.status_code == 500 and "simulated" in r.json()["error"]["message"]
    r = await http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 4})
    assert r.status_code == 200


async def test_every_status_sent_is_counted(http, app, backend, monkeypatch):
    """500 (an unhandled fault) and 413 (refused before routing) answers reach
    `codespec_requests_total`, under the route they were sent to."""
    import httpx2

    import codespec.server.routes as routes

    def fault(*args):
        raise ZeroDivisionError("simulated fault")

    monkeypatch.setattr(routes.prompts, "encode_prompt", fault)
    # Starlette answers 500 and raises on, to the server: the test transport must not re-raise it
    transport = httpx2.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx2.AsyncClient(transport=transport, base_url="http://test") as client:
        r = await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 1})
    assert r.status_code == 500, r.text
    r = await http.post("/v1/completions", json={"prompt": "x" * (backend.settings.max_request_bytes + 1)})
    assert r.status_code == 413
    text = (await http.get("/metrics")).text
    for status in ("500", "413"):
        assert f'codespec_requests_total{{route="/v1/completions",status="{status}"}}' in text, status


async def test_a_prompt_hinted_ahead_is_prefilled_before_its_infill(http, backend):
    """`POST /v1/lsp/prefill` (the language server's idle-time hint, over `--shared`):
    the scheduler computes the prompt's whole chunks while idle; the /infill that follows
    (codespec's `fim_layout` spm) finds them cached and answers as plain decoding would."""
    from codespec import prompts

    body = {"input_prefix": "import os\n\n\ndef list_python_files(path):\n", "prompt": "    ",
            "input_suffix": "\n\nif __name__ == '__main__':\n    print(list_python_files('.'))\n",
            "input_extra": [{"filename": "numbers.py",
                             "text": "".join(f"def add_{i}(x):\n    return x + {i}\n\n" for i in range(40))}],
            "fim_layout": "spm", "n_predict": 16}
    before = backend.scheduler.ahead_tokens
    hint = await http.post("/v1/lsp/prefill", json={**body, "key": "file:///a.py"})
    assert hint.status_code == 200 and hint.json()["ok"], hint.text
    tokens = hint.json()["tokens"]
    whole = backend.engine.cache.reusable_end(tokens)  # whole chunks, the last one's whole sub-chunks
    assert whole >= 256
    for _ in range(600):  # the scheduler forgets a hint once all its passes are cached
        if "file:///a.py" not in backend.scheduler._ahead:
            break
        await asyncio.sleep(0.05)
    # computed ahead: what the cache lacked of it (with exact prefix reuse an earlier
    # request's first tokens may be cached already)
    assert 0 < backend.scheduler.ahead_tokens - before <= whole
    out = (await http.post("/infill", json=body)).json()
    assert out["tokens_evaluated"] == tokens and out["tokens_cached"] == whole, out
    extra = [prompts.ExtraFile(c["filename"], c["text"]) for c in body["input_extra"]]
    ids = prompts.fim_ids(backend.tokenizer, body["input_prefix"], body["input_suffix"], "", extra, layout="spm")
    plain = backend.engine.generate(ids, GenerationConfig(max_new_tokens=16, speculate=False)).text
    assert out["content"] == plain[4:] if plain.startswith("    ") else out["content"] == ""  # spaces held back
    forget = await http.post("/v1/lsp/prefill", json={"key": "file:///a.py", "forget": True})
    assert forget.json() == {"ok": True, "tokens": 0}


async def test_a_prompt_too_long_for_any_tokenization_is_refused_before_tokenizing(http, backend, monkeypatch):
    """No token holds more characters than the vocabulary's longest entry: text past
    context x that many characters cannot fit, and tokenizing it would take seconds."""
    from codespec.errors import RequestError
    from codespec.server.backend import longest_token_chars

    chars = backend.engine.context_limit * longest_token_chars(backend.tokenizer) + 1
    with pytest.raises(RequestError, match="characters"):
        backend.check_prompt_size("x" * (chars - 1), "y")
    backend.check_prompt_size("x" * (chars - 1))  # may fit: left to the tokenizer
    import httpx2

    from codespec.server.app import create_app

    roomy = create_app(backend.settings.model_copy(update={"max_request_bytes": 2 * chars}), backend=backend)
    monkeypatch.setattr("codespec.prompts.encode_prompt", lambda *a: pytest.fail("tokenized"))
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=roomy), base_url="http://test") as client:
        r = await client.post("/v1/completions", json={"prompt": "x" * chars, "max_tokens": 1})
    assert r.status_code == 400 and "characters" in r.json()["error"]["message"], r.text
