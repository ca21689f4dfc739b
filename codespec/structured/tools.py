"""Tool calls in the model's own format: Qwen2.5's `<tool_call>{json}</tool_call>`.

The tools are rendered by the model's chat template (its system prompt lists them, its
assistant turns write earlier calls, `tool` messages come back as `<tool_response>`);
this module says what the output may be (`Toolbox.grammar` for `tool_choice`) and reads
the calls back out of it (`parse_calls`, `CallStream` for streams).

    <tool_call>
    {"name": "read_file", "arguments": {"path": "app.py"}}
    </tool_call>

`tool_choice`: "none" (the tools are not shown, nothing to call), "auto" (text or calls;
a grammar only where some function is `strict`: its arguments then follow its schema),
"required" (one call or more), or one function by name (a call to it). With
`parallel_tool_calls` false a grammar allows one call. Arguments of every call are
validated against their function's schema (jsonschema); a call that does not parse or
validate comes back as text (finish_reason "malformed_tool_call", and why).

Small models slip in two ways this module expects: they write a call's JSON without its
markers (an answer that is nothing but `{"name": ..., "arguments": ...}` objects of listed
tools is read as those calls), and after a call they write it again, and again (a call
that repeats an earlier one word for word ends the answer before it: `repeated_call_end`,
a text rule that plain and speculative decoding stop at alike).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterator

from codespec.errors import RequestError
from codespec.structured.grammar import JSON_OPTIONS, Grammar, check_schema, validation_error

OPEN, CLOSE = "<tool_call>", "</tool_call>"
MALFORMED = "malformed_tool_call"  # finish_reason of an answer whose call could not be read
EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class Function:
    name: str
    parameters: dict[str, Any]
    strict: bool = False


@dataclass(frozen=True)
class Call:
    name: str
    arguments: str  # JSON text, as OpenAI sends it
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")

    def to_json(self, index: int | None = None) -> dict[str, Any]:
        out = {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        return out if index is None else {"index": index, **out}


class Toolbox:
    """A request's tools and its `tool_choice`, checked (a 400 names the field)."""

    def __init__(self, tools: list[dict[str, Any]], choice: str | dict[str, Any] | None, parallel: bool = True) -> None:
        self.functions: dict[str, Function] = {}
        for i, tool in enumerate(tools):
            function = tool["function"]
            name = function["name"]
            if name in self.functions:
                raise RequestError(f"tools[{i}].function.name: {name!r} is given twice")
            parameters = function.get("parameters") or EMPTY_PARAMETERS
            check_schema(parameters, f"tools[{i}].function.parameters")
            self.functions[name] = Function(name, parameters, bool(function.get("strict")))
        self.choice = choice if choice is not None else ("auto" if tools else "none")
        self.named: str | None = None
        if isinstance(self.choice, dict):
            self.named = self.choice["function"]["name"]
            if self.named not in self.functions:
                raise RequestError(f"tool_choice: no tool is named {self.named!r} (tools: {sorted(self.functions)})")
        elif self.choice in ("required", "auto") and not tools:
            raise RequestError(f"tool_choice {self.choice!r} needs tools")
        self.parallel = parallel
        self.tools = tools

    @property
    def shown(self) -> list[dict[str, Any]] | None:
        """The tools the chat template lists (none for tool_choice "none")."""
        return None if self.choice == "none" or not self.tools else self.tools

    @property
    def calling(self) -> bool:
        """Whether the output is read for tool calls."""
        return self.shown is not None

    @property
    def grammar_needed(self) -> bool:
        """Whether `tool_choice` constrains the output: required, a named function, or
        auto with a strict function."""
        return self.calling and (self.choice != "auto" or any(f.strict for f in self.functions.values()))

    def grammar(self, tokens: Any, open_id: int | None, close_id: int | None) -> Grammar | None:
        """What the output may be under `tool_choice` (None: free text). `open_id` and
        `close_id`: the tokenizer's `<tool_call>` and `</tool_call>` tokens."""
        if not self.grammar_needed:
            return None
        if open_id is None or close_id is None:
            raise RequestError(f"tool_choice {self.choice!r}: this model's tokenizer has no {OPEN} token")
        names = [self.named] if self.named else list(self.functions)
        body = {"anyOf": [self._call_schema(self.functions[n]) for n in names], "x-guidance": JSON_OPTIONS}
        call = f'<[{open_id}]> "\\n" %json {json.dumps(body)} "\\n" <[{close_id}]>'
        calls = "call" if not self.parallel else 'call ("\\n" call)*'
        rules = [f"call: {call}", f"calls: {calls}"]
        if self.choice == "auto":  # text, or calls (text before them too): TEXT never holds a tool token
            start = "start: TEXT | TEXT? calls"
            rules.append("TEXT: /(.|\\n)+/")
        else:
            start = "start: calls"
        return Grammar.lark(tokens, "\n".join([start, *rules]), "tools")

    def _call_schema(self, function: Function) -> dict[str, Any]:
        # a strict function's arguments follow its schema; the others' are any JSON object
        # (validated after: a model that writes bad arguments gets them back as text)
        arguments = function.parameters if function.strict or self.choice != "auto" else {"type": "object"}
        return {"type": "object", "properties": {"name": {"const": function.name}, "arguments": arguments},
                "required": ["name", "arguments"], "additionalProperties": False}

    def read(self, text: str) -> tuple[str | None, list[Call], str | None]:
        """The answer's content, its calls and what was wrong with them (None: nothing)."""
        content, bodies = split_calls(text)
        if not bodies and self._bare_calls(text):
            content, bodies = "", [body for _, _, body in _bare_values(text)]
        calls: list[Call] = []
        for body in bodies:
            call, problem = self._call(body)
            if problem is not None:
                return text, [], problem
            calls.append(call)
        if not self.parallel:
            calls = calls[:1]
        return (content or None) if calls else text, calls, None

    def _bare_calls(self, text: str) -> bool:
        """Whether `text` is nothing but calls' JSON without their markers."""
        values = list(_bare_values(text))
        if not values or text[values[-1][1]:].strip():
            return False
        for _, _, body in values:
            value = json.loads(body)
            if not (isinstance(value, dict) and value.get("name") in self.functions and "arguments" in value):
                return False
        return True

    def _call(self, body: str) -> tuple[Call | None, str | None]:
        try:
            value = json.loads(body)
        except json.JSONDecodeError as exc:
            return None, f"a tool call is not JSON ({exc.msg} at character {exc.pos})"
        if not isinstance(value, dict) or not isinstance(value.get("name"), str):
            return None, 'a tool call is not {"name": ..., "arguments": {...}}'
        function = self.functions.get(value["name"])
        if function is None:
            return None, f"the model called {value['name']!r}, which is not among the tools"
        arguments = value.get("arguments", {})
        if isinstance(arguments, str):  # some models write the arguments as a JSON string
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                return None, f"the arguments of {function.name!r} are not JSON"
        problem = validation_error(function.parameters, arguments)
        if problem is not None:
            return None, f"the arguments of {function.name!r} do not follow its parameters: {problem}"
        return Call(function.name, json.dumps(arguments, ensure_ascii=False)), None


def split_calls(text: str) -> tuple[str, list[str]]:
    """The text before the first call, and each call's body (what `<tool_call>` and
    `</tool_call>` enclose; an unclosed one runs to the end).

    >>> split_calls('Reading it.<tool_call>\\n{"name": "f"}\\n</tool_call>')
    ('Reading it.', ['{"name": "f"}'])
    """
    start = text.find(OPEN)
    if start < 0:
        return text, []
    content, bodies, rest = text[:start].rstrip(), [], text[start:]
    while rest.startswith(OPEN):
        end = rest.find(CLOSE)
        body = rest[len(OPEN): end if end >= 0 else len(rest)]
        bodies.append(body.strip())
        rest = "" if end < 0 else rest[end + len(CLOSE):].lstrip()
    if rest:  # text after the calls: not the format (a call ends the answer)
        bodies.append(rest)
    return content, bodies


def repeated_call_end(text: str) -> tuple[int, int] | None:
    """Where an answer ends that repeats a call: after the call before the repeat (and
    how far the text must reach to know it: the repeat's end); None while no complete
    call repeats an earlier one. Calls are compared as JSON values (a repeat may be laid
    out differently). `GenerationConfig.end_at`'s rule.

    >>> call = '<tool_call>\\n{"name": "f", "arguments": {}}\\n</tool_call>'
    >>> repeated_call_end(call + "\\n" + call.replace(": ", ":") + "\\n")
    (55, 109)
    >>> repeated_call_end('{"name": "f"}\\n{"name": "f"}')   # written without markers
    (13, 27)
    """
    seen: set[str] = set()
    previous_end = 0
    for start, end, body in _call_spans(text):
        try:
            key = json.dumps(json.loads(body), sort_keys=True)
        except json.JSONDecodeError:
            key = body.strip()
        if key in seen:
            return previous_end, end
        seen.add(key)
        previous_end = end
    return None


def _call_spans(text: str) -> Iterator[tuple[int, int, str]]:
    """The complete calls of `text`: (start, end, JSON body) of each `<tool_call>` block;
    or, in an answer that starts with `{`, of each JSON value in a row."""
    if text.lstrip().startswith("{"):
        yield from _bare_values(text)
        return
    position = 0
    while (start := text.find(OPEN, position)) >= 0 and (end := text.find(CLOSE, start)) >= 0:
        position = end + len(CLOSE)
        yield start, position, text[start + len(OPEN): end].strip()


def _bare_values(text: str) -> Iterator[tuple[int, int, str]]:
    """Complete JSON values one after the other from the text's start (whitespace between)."""
    decoder, position = json.JSONDecoder(), 0
    while True:
        start = len(text) - len(text[position:].lstrip())
        if start >= len(text):
            return
        try:
            _, end = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            return
        yield start, end, text[start:end]
        position = end


def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI messages as the chat template takes them: an assistant's tool calls with
    their arguments as objects (OpenAI sends JSON text; the template writes them with
    `tojson`, as the model wrote them)."""
    out = []
    for message in messages:
        calls = message.get("tool_calls")
        if calls:
            message = {**message, "tool_calls": [_template_call(c) for c in calls]}
        out.append(message)
    return out


def _template_call(call: dict[str, Any]) -> dict[str, Any]:
    function = call.get("function", {})
    arguments = function.get("arguments", "{}")
    try:
        arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
    except json.JSONDecodeError as exc:
        raise RequestError(f"an assistant message's tool call {function.get('name')!r} has arguments that are "
                           f"not JSON: {exc.msg}") from exc
    return {**call, "function": {**function, "arguments": arguments}}


class CallStream:
    """A stream's text, piece by piece, as content deltas until a call starts; then the
    calls, each as one delta when it closes (`finish` reads them all at the end)."""

    def __init__(self) -> None:
        self.raw, self.sent = "", 0

    def push(self, piece: str) -> str:
        """The content that is certain to be content after `piece` (none of an answer
        that starts as JSON: it may be a call without its markers)."""
        self.raw += piece
        if self.raw.lstrip().startswith("{"):
            return ""
        start = self.raw.find(OPEN)
        if start < 0:  # hold back what could be the start of a call marker
            start = len(self.raw) - next((k for k in range(min(len(OPEN) - 1, len(self.raw)), 0, -1)
                                          if OPEN.startswith(self.raw[-k:])), 0)
        out = self.raw[self.sent:start]
        self.sent = max(self.sent, start)
        return out

    def unsent(self) -> str:
        return self.raw[self.sent:]
