"""Tool calls read out of the model's text, and the requests' tools checked (no model)."""

from __future__ import annotations

import json

import pytest

from codespec.errors import RequestError
from codespec.structured.tools import (MALFORMED, CallStream, Toolbox, repeated_call_end, split_calls,
                                       template_messages)

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
LS = {"type": "function", "function": {"name": "ls"}}


def call(name: str, arguments: object) -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


def test_calls_are_read_with_their_arguments_as_json_text():
    content, calls, problem = Toolbox([WEATHER, LS], "auto").read(
        "Checking." + call("get_weather", {"city": "Paris"}) + "\n" + call("ls", {}))
    assert problem is None and content == "Checking."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Paris"}), ("ls", {})]
    assert all(c.id.startswith("call_") for c in calls) and calls[0].id != calls[1].id
    assert calls[0].to_json(0) == {"index": 0, "id": calls[0].id, "type": "function",
                                   "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}


def test_a_call_without_its_markers_is_a_call_and_plain_json_is_not():
    box = Toolbox([WEATHER], "auto")
    _, calls, _ = box.read('{"name": "get_weather", "arguments": {"city": "Rome"}}\n')
    assert [c.name for c in calls] == ["get_weather"]
    content, calls, problem = box.read('{"city": "Rome"}')
    assert calls == [] and content == '{"city": "Rome"}' and problem is None


@pytest.mark.parametrize("text, why", [
    (call("get_weather", {"city": 3}), "do not follow its parameters"),
    (call("get_weather", {}), "'city' is a required property"),
    (call("delete_everything", {}), "not among the tools"),
    ("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\"\n</tool_call>", "not JSON"),
])
def test_a_malformed_call_comes_back_as_text_with_the_reason(text, why):
    content, calls, problem = Toolbox([WEATHER], "auto").read(text)
    assert calls == [] and content == text and why in problem
    assert MALFORMED == "malformed_tool_call"


def test_one_call_when_parallel_calls_are_off():
    _, calls, _ = Toolbox([WEATHER, LS], "auto", parallel=False).read(call("ls", {}) + "\n" + call("ls", {"a": 1}))
    assert len(calls) == 1


@pytest.mark.parametrize("tools, choice, message", [
    ([WEATHER, WEATHER], "auto", "given twice"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "nonsense"}}}], "auto",
     r"tools\[0\].function.parameters: not a valid JSON schema"),
    ([WEATHER], {"type": "function", "function": {"name": "nope"}}, "no tool is named 'nope'"),
    ([], "required", "needs tools"),
])
def test_bad_tools_are_refused_naming_the_field(tools, choice, message):
    with pytest.raises(RequestError, match=message):
        Toolbox(tools, choice)


def test_tool_choice_none_shows_no_tools_and_reads_no_calls():
    box = Toolbox([WEATHER], "none")
    assert box.shown is None and not box.calling and not box.grammar_needed
    assert Toolbox([WEATHER], None).choice == "auto" and Toolbox([], None).choice == "none"


def test_which_choices_need_a_grammar():
    strict = {"type": "function", "function": {**WEATHER["function"], "strict": True}}
    assert not Toolbox([WEATHER], "auto").grammar_needed
    assert Toolbox([strict], "auto").grammar_needed
    assert Toolbox([WEATHER], "required").grammar_needed
    assert Toolbox([WEATHER], {"type": "function", "function": {"name": "get_weather"}}).grammar_needed


def test_a_repeated_call_ends_the_answer_before_it():
    first, second = call("get_weather", {"city": "Paris"}), call("ls", {})
    again = '<tool_call>\n{"name":"get_weather","arguments":{"city":"Paris"}}\n</tool_call>'  # laid out otherwise
    text = first + "\n" + second + "\n" + again
    end, reach = repeated_call_end(text)
    assert text[:end] == first + "\n" + second and reach == len(text)
    assert repeated_call_end(first + "\n" + second) is None
    assert repeated_call_end(first + "\n" + first[:20]) is None  # not complete yet


def test_split_calls_keeps_text_after_the_calls_as_a_body():
    assert split_calls("no calls") == ("no calls", [])
    assert split_calls(call("ls", {}) + "\nthen prose")[1][1] == "then prose"


def test_a_stream_holds_back_what_may_start_a_call():
    stream = CallStream()
    pieces = [stream.push(p) for p in ["Let me look", " <tool", "_call>\n{", '"name"']]
    assert pieces == ["Let me look", " ", "", ""]
    assert stream.unsent().startswith("<tool_call>")
    assert CallStream().push('  {"name": ') == ""  # a call without markers, maybe


def test_assistant_calls_reach_the_template_with_object_arguments():
    messages = [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "ls", "arguments": '{"path": "."}'}}]}]
    assert template_messages(messages)[0]["tool_calls"][0]["function"]["arguments"] == {"path": "."}
    bad = [{"role": "assistant", "tool_calls": [{"function": {"name": "ls", "arguments": "{oops"}}]}]
    with pytest.raises(RequestError, match="not JSON"):
        template_messages(bad)
