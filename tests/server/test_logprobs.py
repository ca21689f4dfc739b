"""Logprobs through the HTTP routes with the openai client (real default model): the
chat and legacy completion shapes, streamed and not, with the same tokens and values
either way and the same text as a request without logprobs."""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.model, pytest.mark.anyio]

PROMPT = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"
CHAT = [{"role": "user", "content": "Write a Python function that reverses a string."}]


async def test_chat_logprobs_streamed_and_not(client):
    args = dict(model="codespec", messages=CHAT, max_tokens=20)
    plain = await client.chat.completions.create(**args)
    out = await client.chat.completions.create(**args, logprobs=True, top_logprobs=2)
    text = out.choices[0].message.content
    assert text == plain.choices[0].message.content  # asking for logprobs changes no token
    content = out.choices[0].logprobs.content
    assert len(content) == out.usage.completion_tokens == 20
    assert b"".join(bytes(e.bytes) for e in content).decode("utf-8") == text
    for entry in content:
        assert entry.logprob <= 0.0 and len(entry.top_logprobs) == 2
        assert entry.top_logprobs[0].token == entry.token  # greedy: the likeliest token was chosen
        assert entry.top_logprobs[0].logprob == entry.logprob >= entry.top_logprobs[1].logprob
    streamed, pieces = [], []
    async for event in await client.chat.completions.create(**args, logprobs=True, top_logprobs=2, stream=True):
        pieces.append(event.choices[0].delta.content or "")
        if event.choices[0].logprobs is not None:
            streamed.extend(event.choices[0].logprobs.content)
    assert "".join(pieces) == text
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in content]
    unasked = await client.chat.completions.create(**args)
    assert unasked.choices[0].logprobs is None


async def test_completion_logprobs_and_a_stop_string(client):
    args = dict(model="codespec", prompt=PROMPT, max_tokens=24)
    free = await client.completions.create(**args)
    stop = "\n"  # cuts the text at its first newline, inside the run
    assert stop in free.choices[0].text.lstrip("\n")
    out = await client.completions.create(**args, logprobs=1, stop=[stop])
    text, logprobs = out.choices[0].text, out.choices[0].logprobs
    assert free.choices[0].text.startswith(text) and stop not in text
    assert "".join(logprobs.tokens).startswith(text) and len("".join(logprobs.tokens[:-1])) < max(len(text), 1)
    assert logprobs.text_offset == [sum(len(t) for t in logprobs.tokens[:i]) for i in range(len(logprobs.tokens))]
    assert all(len(top) <= 1 for top in logprobs.top_logprobs)
    tokens, offsets = [], []
    async for event in await client.completions.create(**args, logprobs=1, stop=[stop], stream=True):
        if event.choices[0].logprobs is not None:
            tokens.extend(event.choices[0].logprobs.tokens)
            offsets.extend(event.choices[0].logprobs.text_offset)
    assert tokens == logprobs.tokens and offsets == logprobs.text_offset


async def test_bad_logprob_settings_are_400(http):
    for path, body, message in [
        ("/v1/completions", {"prompt": "x", "logprobs": 21}, "logprobs"),
        ("/v1/completions", {"prompt": "x", "logprobs": True}, "logprobs"),
        ("/v1/chat/completions", {"messages": CHAT, "top_logprobs": 2}, "top_logprobs needs logprobs"),
        ("/v1/chat/completions", {"messages": CHAT, "logprobs": "yes"}, "logprobs"),
        ("/v1/chat/completions", {"messages": CHAT, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ]:
        r = await http.post(path, content=json.dumps(body), headers={"content-type": "application/json"})
        assert r.status_code == 400 and message in r.json()["error"]["message"], (body, r.text)


async def test_a_stream_that_fails_after_its_headers_ends_with_an_error_and_done(http, backend, monkeypatch):
    """A fault in a chunk's conversion (here the token names that logprobs show) comes
    after the 200 and its headers: the client still gets an error event and `[DONE]`,
    not a cut connection."""
    def broken(token: int) -> bytes:
        raise AttributeError("simulated: no token names")

    monkeypatch.setattr(backend.token_text, "bytes", broken)
    r = await http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 4, "logprobs": 2, "stream": True})
    events = [line[len("data: "):] for line in r.text.splitlines() if line.startswith("data: ")]
    assert r.status_code == 200 and events[-1] == "[DONE]", events
    assert "simulated" in json.loads(events[-2])["error"]["message"]
    assert (await http.get("/health")).status_code == 200
