"""Agents through the `openai` SDK against a real `codespec serve` process: tool calls
(streamed and not, arguments validated), response_format from a pydantic model through
the SDK's `parse` helper, predicted outputs, and the 400s that name the field."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import jsonschema
import pytest
from pydantic import BaseModel

pytestmark = pytest.mark.model

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


class Person(BaseModel):
    name: str
    age: int


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    repo = tmp_path_factory.mktemp("repo")
    process = subprocess.Popen([sys.executable, "-m", "codespec", "serve", "--port", str(port), "--repo", str(repo)],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=os.environ.copy())
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    try:
        while True:
            assert process.poll() is None, process.stdout.read()
            try:
                urllib.request.urlopen(base + "/health", timeout=2)
                break
            except OSError:
                assert time.monotonic() < deadline, "codespec serve did not start in 180 s"
                time.sleep(0.3)
        yield base
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.fixture(scope="module")
def client(server):
    import openai

    with openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0, timeout=300) as client:
        yield client


@pytest.fixture(scope="module")
def model(client):
    return client.models.list().data[0].id


def encode(text: str) -> list[int]:
    from codespec import prompts
    from codespec.models.loading import load_tokenizer
    from codespec.settings import Settings

    return prompts.encode(load_tokenizer(Settings(), progress=False), text)


def check_call(name: str, arguments: str) -> None:
    assert name == "get_weather"
    jsonschema.validate(json.loads(arguments), WEATHER["function"]["parameters"])


def test_tool_calls_streamed_and_not(client, model):
    out = client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER], max_tokens=80)
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls
    check_call(call.function.name, call.function.arguments)
    calls: dict[int, dict[str, str]] = {}
    finish = None
    for chunk in client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER], max_tokens=80,
                                                stream=True):
        delta = chunk.choices[0].delta
        for part in delta.tool_calls or []:
            entry = calls.setdefault(part.index, {"name": "", "arguments": ""})
            entry["name"] += part.function.name or ""
            entry["arguments"] += part.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls" and list(calls) == [0]
    check_call(calls[0]["name"], calls[0]["arguments"])
    assert json.loads(calls[0]["arguments"]) == json.loads(call.function.arguments)  # greedy: the same call


def test_a_required_or_named_call_and_the_tool_result_back(client, model):
    named = {"type": "function", "function": {"name": "get_weather"}}
    for choice in ("required", named):
        out = client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER], tool_choice=choice,
                                             max_tokens=80)
        assert out.choices[0].finish_reason == "tool_calls"
        call = out.choices[0].message.tool_calls[0]
        check_call(call.function.name, call.function.arguments)
    history = [*ASK, out.choices[0].message.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": call.id, "content": "18 C and sunny"}]
    answer = client.chat.completions.create(model=model, messages=history, tools=[WEATHER], tool_choice="none",
                                            max_tokens=40)
    alone = client.chat.completions.create(model=model, messages=ASK, max_tokens=1)
    # the call and its result are in the prompt (the template renders them back)
    assert answer.choices[0].message.content and answer.usage.prompt_tokens > alone.usage.prompt_tokens + 20


def test_a_pydantic_response_format_through_the_parse_helper(client, model):
    out = client.chat.completions.parse(model=model, messages=[{"role": "user", "content": "Invent a person."}],
                                        response_format=Person, max_tokens=60)
    assert isinstance(out.choices[0].message.parsed, Person)
    ask = "The capital of France as JSON, with the keys country and capital."
    json_object = client.chat.completions.create(model=model, messages=[{"role": "user", "content": ask}],
                                                 response_format={"type": "json_object"}, max_tokens=200)
    assert json_object.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(json_object.choices[0].message.content), dict)


def test_a_prediction_is_reported_and_changes_nothing(client, model):
    code = "def area(width, height):\n    return width * height\n"
    messages = [{"role": "user", "content": f"Rename `width` to `w`. Reply with the code only.\n\n{code}"}]
    plain = client.chat.completions.create(model=model, messages=messages, max_tokens=60)
    predicted = client.chat.completions.create(model=model, messages=messages, max_tokens=60,
                                               prediction={"type": "content", "content": code})
    assert predicted.choices[0].message.content == plain.choices[0].message.content
    details = predicted.usage.completion_tokens_details
    assert details.accepted_prediction_tokens > 0
    assert details.accepted_prediction_tokens + details.rejected_prediction_tokens == len(encode(code))
    completion = client.completions.create(model=model, prompt="def area(width, height):\n", max_tokens=20,
                                           extra_body={"prediction": {"type": "content", "content": code}})
    assert completion.usage.completion_tokens_details.accepted_prediction_tokens >= 0


@pytest.mark.parametrize("extra, message", [
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "nonsense"}}}]},
     "tools[0].function.parameters"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "no tool is named"),
    ({"prediction": {"type": "content", "content": 3}}, "prediction"),
    ({"prediction": {"type": "file", "content": "x"}}, "prediction"),
    ({"prediction": {"type": "content", "content": "x = 1\n" * 20000}}, "prediction"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": {
        "type": "object", "properties": {"a": {"$ref": "#/definitions/missing"}}}}}}, "response_format"),
    ({"response_format": {"type": "json_object"}, "tools": [WEATHER]}, "response_format"),
])
def test_bad_agent_requests_get_a_400_naming_the_field(client, model, extra, message):
    import openai

    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model=model, messages=ASK, max_tokens=8, extra_body=extra)
    assert message in str(raised.value)
