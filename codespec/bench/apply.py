"""Agent requests for `codespec bench apply`: fast apply and a tool-calling loop, built
from standard-library code that no other benchmark, test or example uses.

* `apply`: the layout the fast-apply services publish (Morph's): an instruction, the
  original code and an edit snippet whose unchanged parts are `# ... existing code ...`
  markers, answered with the merged code. The code is a stretch of a module around one
  function; the edit renames a local of that function. The original code is the
  request's `prediction`, as an agent that holds the file sends it.
* `agent`: a tool-calling conversation over the same kind of code: the user asks for
  the rename, the assistant has called `read_file`, the tool's answer (the file) is in
  the conversation, and the model answers with its next call, `write_file` with the
  whole new content, or the content itself. The file is the prediction.

Every prompt is fixed (the history is scripted, never the model's own), so every system
answers the same prompt; the set changes only with the Python version.

    requests = apply_requests(tokenizer)        # 6 apply + 4 agent
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
from dataclasses import dataclass
from typing import Any

from codespec.bench.request_sets import functions, local_to_rename
from codespec.prompts import chat_ids
from codespec.structured.tools import template_messages

APPLY_MODULES = ("configparser", "fileinput", "gzip", "queue", "socketserver", "timeit", "trace", "zipapp",
                 "filecmp", "getopt")
APPLY_COUNT, AGENT_COUNT = 6, 4
FUNCTION_LINES = (8, 30)  # the edited function
AROUND = 14  # lines of the module kept before and after it
MARKER = "# ... existing code ..."
INSTRUCTION = ("Merge the update into the code: keep every line the update does not change. Answer with the "
               "complete merged code only.")
TOOLS = [
    {"type": "function", "function": {
        "name": "read_file", "description": "Read a file of the repository.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}},
    {"type": "function", "function": {
        "name": "write_file", "description": "Replace a file's whole content.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                       "required": ["path", "content"]}}},
]


@dataclass(frozen=True)
class AgentRequest:
    name: str
    kind: str  # "apply" or "agent"
    prompt_ids: tuple[int, ...]
    prediction: str  # the code the answer rewrites
    max_new_tokens: int
    repository: dict[str, str] | None = None  # no index: the request holds its code


def apply_requests(tokenizer: Any) -> list[AgentRequest]:
    """`APPLY_COUNT` apply requests, then `AGENT_COUNT` agent ones, in a fixed order."""
    targets = list(_targets())
    out = [_apply(tokenizer, *t) for t in targets[:APPLY_COUNT]]
    out += [_agent(tokenizer, *t) for t in targets[APPLY_COUNT: APPLY_COUNT + AGENT_COUNT]]
    return out


def _targets() -> Any:
    """(module, function name, code, local, function, edited function) for one function
    of each module."""
    for name in APPLY_MODULES:
        source = inspect.getsource(importlib.import_module(name))
        lines = source.splitlines(keepends=True)
        for fn in functions(ast.parse(source)):
            length = (fn.end_lineno or fn.lineno) - fn.lineno + 1
            local = local_to_rename(fn)
            if not FUNCTION_LINES[0] <= length <= FUNCTION_LINES[1] or local is None:
                continue
            start, end = max(0, fn.lineno - 1 - AROUND), min(len(lines), (fn.end_lineno or fn.lineno) + AROUND)
            code = "".join(lines[start:end])
            body = "".join(lines[fn.lineno - 1: fn.end_lineno])
            yield name, fn.name, code, local, body, _renamed(body, local, f"{local}_value")
            break


def _renamed(code: str, old: str, new: str) -> str:
    import re

    return re.sub(rf"\b{re.escape(old)}\b", new, code)


def _apply(tokenizer: Any, module: str, fn: str, code: str, local: str, body: str, edited_body: str) -> AgentRequest:
    indent = body[: len(body) - len(body.lstrip())]
    update = f"{indent}{MARKER}\n\n{edited_body.rstrip()}\n\n{indent}{MARKER}\n"
    message = (f"{INSTRUCTION}\n\n<instruction>Rename the local variable `{local}` of `{fn}` to `{local}_value`."
               f"</instruction>\n<code>{code}</code>\n<update>{update}</update>")
    ids = chat_ids(tokenizer, [{"role": "user", "content": message}])
    return AgentRequest(f"apply:{module}.{fn}", "apply", tuple(ids), code, _budget(tokenizer, code))


def _agent(tokenizer: Any, module: str, fn: str, code: str, local: str, body: str, edited_body: str) -> AgentRequest:
    path = f"{module.replace('.', '/')}.py"
    call = {"id": "call_0", "type": "function", "function": {"name": "read_file",
                                                               "arguments": json.dumps({"path": path})}}
    messages = [
        {"role": "user", "content": f"In {path}, rename the local variable `{local}` of `{fn}` to `{local}_value`, "
                                    "then write the file back."},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_0", "content": code},
    ]
    ids = chat_ids(tokenizer, template_messages(messages), TOOLS)
    return AgentRequest(f"agent:{module}.{fn}", "agent", tuple(ids), code, _budget(tokenizer, code) + 32)


def _budget(tokenizer: Any, code: str) -> int:
    """Room for the whole code and a little more (a fence, a sentence)."""
    from codespec.prompts import encode

    return len(encode(tokenizer, code)) + 48
