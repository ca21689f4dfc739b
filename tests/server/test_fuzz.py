"""Fuzzing the HTTP surface: hypothesis-generated bodies, from random JSON to
near-valid requests with wrong types and edge values, on every POST route. Each gets a
well-formed answer (a 2xx with the route's shape, or a 4xx with an OpenAI-style error
body, never a 500) and the server answers /health after. Over a tiny model, so a valid
request costs milliseconds; the count is bounded (CI's time)."""

from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from codespec.index import SuffixIndex
from codespec.server.app import create_app
from codespec.server.backend import Backend
from codespec.settings import Settings
from tests.caches import fresh_cache
from tests.lsp.tiny_fim import tiny_fim_model

CHATML = ("{% for m in messages %}<|fim_prefix|>{{ m['role'] }}\n{{ m['content'] }}<|endoftext|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|fim_prefix|>assistant\n{% endif %}")
ROUTES = ["/v1/completions", "/v1/chat/completions", "/infill", "/v1/index/documents"]
EXAMPLES = 300

scalars = (st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
           | st.floats(allow_nan=False) | st.text(max_size=40))
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
texts = st.text(max_size=60) | st.sampled_from(["<|im_end|>", "<|fim_middle|>", "a\ud800b", "", "\x00", "def f("])
VALID = {  # a request each route serves; the fuzz changes some of its fields
    "/v1/completions": {"prompt": "def f(", "max_tokens": 4},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
    "/infill": {"input_prefix": "def f(", "input_suffix": "\n", "n_predict": 4},
    "/v1/index/documents": {"key": "a.py", "text": "x = 1\n"},
}


def odd(valid):  # mostly a value of the field's type, sometimes anything
    return valid | json_values


FIELDS = {
    "prompt": odd(texts | st.lists(texts, max_size=2) | st.lists(st.integers(-5, 300), max_size=5)),
    "suffix": odd(texts),
    "messages": odd(st.lists(st.fixed_dictionaries({
        "role": st.sampled_from(["user", "system", "developer", "tool", "assistant", "x"]),
        "content": odd(texts | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": texts}),
                                        max_size=2))}), max_size=3)),
    "input_prefix": odd(texts), "input_suffix": odd(texts), "prompt_extra": json_values,
    "input_extra": odd(st.lists(st.fixed_dictionaries({"filename": texts, "text": texts}), max_size=2)),
    "max_tokens": odd(st.integers(-3, 10)), "n_predict": odd(st.integers(-2, 10)),
    "t_max_predict_ms": odd(st.integers(-1, 50)), "temperature": odd(st.floats(-1, 3)),
    "top_p": odd(st.floats(-1, 2)), "top_k": odd(st.integers(-1, 5)), "seed": odd(st.integers(-(2**65), 2**65)),
    "stream": odd(st.booleans()), "stop": odd(texts | st.lists(texts, max_size=3)),
    "logprobs": odd(st.booleans()), "n": odd(st.integers(0, 3)), "model": odd(st.sampled_from(["codespec", "x"])),
    "response_fields": odd(st.lists(st.sampled_from(["content", "timings/prompt_n", "x/y", ""]), max_size=3)),
    "key": odd(texts), "text": odd(texts), "cache_prompt": odd(st.booleans()),
}


@st.composite
def requests(draw):
    route = draw(st.sampled_from(ROUTES))
    kind = draw(st.sampled_from(["changed", "changed", "changed", "json", "bytes"]))
    if kind == "json":
        return route, draw(json_values)
    if kind == "bytes":
        return route, draw(st.binary(max_size=64))
    changed = draw(st.lists(st.sampled_from(sorted(FIELDS)), max_size=3, unique=True))
    return route, {**VALID[route], **{name: draw(FIELDS[name]) for name in changed}}


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    from codespec.forward import select as forward

    model = tiny_fim_model(tmp_path_factory.mktemp("tiny") / "model")
    # a cache of its own: the tiny model's machine profile stays out of the user's cache
    settings = Settings(model=str(model), max_tokens_limit=8, max_request_bytes=64 * 1024,
                        cache_dir=fresh_cache(tmp_path_factory.mktemp("cache")))
    loaded = forward.load(settings, progress=False)
    loaded.tokenizer.chat_template = CHATML  # the tiny tokenizer has none; the chat route needs one
    backend = Backend.create(loaded, settings, SuffixIndex())
    yield create_app(settings, backend=backend)
    backend.close()


@pytest.fixture(scope="module")
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


async def post(app, route: str, body) -> tuple[int, str, bytes]:
    import httpx2

    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://test",
                                  timeout=60) as http:
        r = await http.post(route, content=content, headers={"content-type": "application/json"})
        return r.status_code, r.headers.get("content-type", ""), r.content


def well_formed(route: str, status: int, kind: str, content: bytes) -> None:
    assert status < 500, (status, content[:500])
    if "text/event-stream" in kind:
        events = [line.removeprefix(b"data: ") for line in content.split(b"\n") if line.startswith(b"data: ")]
        assert events, content[:500]
        for event in events:
            assert event == b"[DONE]" or isinstance(json.loads(event), dict), event
        return
    answer = json.loads(content)
    if status >= 400:
        error = answer["error"]
        assert isinstance(error["message"], str) and error["message"] and error["type"], answer
        assert "Traceback" not in error["message"]
    elif route == "/infill":
        assert isinstance(answer, dict)
    elif route == "/v1/index/documents":
        assert isinstance(answer["tokens"], int)
    else:
        assert isinstance(answer["choices"][0], dict)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(request=requests())
def test_every_body_gets_a_well_formed_answer(app, loop, request):
    route, body = request
    status, kind, content = loop.run_until_complete(post(app, route, body))
    well_formed(route, status, kind, content)


def test_the_server_is_alive_after_the_fuzz(app, loop):
    async def health() -> int:
        import httpx2

        async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://test") as http:
            return (await http.get("/health")).status_code

    assert loop.run_until_complete(health()) == 200
