"""What to complete and where completions end: table-driven, no model."""

from __future__ import annotations

import subprocess
import sys

import pytest

from codespec.lsp.options import parse_options
from codespec.lsp.forwarding import Shown, forward
from codespec.landing.syntax import Mode, classify, repeats_following

BODY = "def add(a, b):\n    \"\"\"Sum.\"\"\"\n    \n\ndef sub(a, b):\n    return a - b\n"


@pytest.mark.parametrize("text, cursor, language, mode", [
    (BODY, BODY.index("    \n") + 4, "python", Mode.MULTI),  # the start of a function body
    ("def add(a, b):", 14, "python", Mode.MULTI),  # the end of a block opener
    ("x = compute(", 12, "python", Mode.MULTI),  # an open bracket
    ("total = valu", 12, "python", Mode.SINGLE),  # the end of a plain line
    ("total = value", 10, "python", Mode.NONE),  # mid-word
    ("print(x)", 6, "python", Mode.SINGLE),  # text follows the cursor
    ("f(a)", 3, "python", Mode.SINGLE),  # only a closer follows: still fine to complete
    ("# a comment that says:", 22, "python", Mode.SINGLE),  # ends with ':' but is a comment
    ("s = 'key: {'", 11, "python", Mode.SINGLE),  # inside a string
    ("function f() {", 14, "javascript", Mode.MULTI),
    ("const s = `a {`;", 14, "typescript", Mode.SINGLE),  # inside a template string
    ("plain text:", 11, "plaintext", Mode.MULTI),  # no grammar: indentation rules only
])
def test_classify(text, cursor, language, mode):
    assert classify(text, cursor, language) is mode


def test_repeats_and_forwarding():
    text = "def f():\n    \n    return 1\n"
    cursor = text.index("    \n") + 4
    assert repeats_following("return 1", text, cursor)
    assert not repeats_following("x = 2\n    return x", text, cursor)
    assert forward(Shown("a = ", "compute(1)"), "a = comp") == "ute(1)"
    assert forward(Shown("a = ", "compute(1)"), "a = x") is None  # typed something else
    assert forward(Shown("a = ", "compute(1)"), "b = comp") is None  # another place


def test_bad_options_fall_back_to_defaults_with_a_message():
    options, problems = parse_options({"maxTokens": "lots", "multiline": False, "unknown": 1})
    assert options.max_tokens == 128 and options.multiline is False
    assert len(problems) == 1 and problems[0].startswith("maxTokens")
    assert parse_options([1, 2])[1]  # not an object: defaults, with a message
    assert parse_options({"codespec": {"debounceMs": 0}})[0].debounce_ms == 0  # didChangeConfiguration shape


def test_the_language_server_never_imports_torch():
    code = ("import sys; import codespec.lsp.server, codespec.lsp.http_backend, codespec.cli.lsp; "
            "assert 'torch' not in sys.modules, 'torch was imported'; "
            "assert 'transformers' not in sys.modules, 'transformers was imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
