"""The typing replay behind `codespec bench editor`: what the person types adds up to the
real functions, requests sit where the person is, scoring and llama.vim's request."""

from __future__ import annotations

import ast
import importlib
import inspect

from codespec.bench.editor import Sample, SystemResult, infill_body
from codespec.bench.typing import FUNCTIONS, Ask, Close, Open, Score, Type, score, typing_replay


def function_source(module: str, name: str) -> str:
    source = inspect.getsource(importlib.import_module(module))  # bisect's functions are C ones: read the module
    node = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef) and n.name == name)
    return "".join(source.splitlines(keepends=True)[node.lineno - 1: node.end_lineno])


def test_the_replay_types_the_real_functions_line_by_line():
    replay = typing_replay()
    asks = replay.asks
    assert len(asks) > 60 and sum(a.first for a in asks) == len(FUNCTIONS)
    assert {a.kind for a in asks} == {"line-start", "mid-line"}
    opened = [e.path for e in replay.events if isinstance(e, Open)]
    assert len(opened) == len(FUNCTIONS) and len(set(opened)) < len(opened)  # files are reopened
    assert sum(isinstance(e, Close) for e in replay.events) == len(FUNCTIONS) - 1
    for ask in asks:  # the request's position is where the text says the cursor is
        line = ask.text.split("\n")[ask.line]
        assert ask.truth and line[: ask.character] == ask.text[ask.offset - ask.character: ask.offset]
    for module, name in FUNCTIONS:
        source = function_source(module, name)
        # once a function is typed, its module holds it as the standard library has it
        typed = [e.text for e in replay.events if isinstance(e, Type) and e.path == f"{module}.py"]
        assert any(source in text for text in typed), name
        # the workspace on disk never holds a body still to be written
        assert source not in replay.workspace[f"{module}.py"], name


def test_scoring_counts_the_matching_first_line_and_characters():
    ask = Ask("m.py", "x", 0, "total = a + b\n    return total\n", "line-start")
    assert score(ask, "total = a + b\n    return 0") == Score(True, 25)
    assert score(ask, "total = a + b  \n").first_line_exact
    assert score(ask, "total = a - b").chars_accepted == 10
    assert score(ask, None).chars_accepted == 0 and not score(ask, "").first_line_exact


def test_llama_vim_request_and_report():
    ask = next(a for a in typing_replay().asks if a.kind == "mid-line")
    body = infill_body(ask, first=True)
    assert body["t_max_predict_ms"] == 250 and infill_body(ask, first=False)["t_max_predict_ms"] == 1000
    assert body["input_prefix"].endswith("\n")
    assert body["input_prefix"] + body["prompt"] + body["input_suffix"] in ask.text + "\n"
    assert body["prompt"] == ask.text[ask.offset - ask.character: ask.offset]
    result = SystemResult("lsp", [Sample("line-start", True, 1.0, True, 5, 100, 0),
                                  Sample("line-start", False, 0.2, False, 1, 100, 90),
                                  Sample("mid-line", False, 0.4, True, 9, None, None),
                                  Sample("mid-line", False, None, False, 0)])
    j = result.to_json()
    assert j["answered"] == 3 and j["first_s"] == 1.0 and j["warm_p50_s"] == 0.3
    assert j["cache_hit_rate"] == 0.45 and j["first_line_exact"] == 0.5 and j["chars_accepted_mean"] == 3.75
