"""`lsp.cut.Landing`: where a suggestion ends, for the place it lands. Table-driven on
hand-made text, then a property over real files: whatever the model writes after a
block cut out of a real function (the block and all that followed it, or other code
after it), what is served stays in the enclosing block and the file parses."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from codespec.landing.cut import Landing, enclosing_indent, infill_mode, next_code_line
from codespec.landing.syntax import Mode

BODY = "def add(a, b):\n    \"\"\"Sum.\"\"\"\n    \n\ndef sub(a, b):\n    return a - b\n"


def at_end(head: str, tail: str = "\n", language: str = "python", mode: Mode = Mode.MULTI) -> Landing:
    return Landing.at(head + tail, len(head), language, mode)


@pytest.mark.parametrize("head, tail, language, mode, streamed, kept, done", [
    ("x = ", "\n", "python", Mode.SINGLE, "value + 1", "value + 1", False),
    ("x = ", "\n", "python", Mode.SINGLE, "value + 1\nnext", "value + 1", True),
    ("def add(a, b):\n    ", "\n", "python", Mode.MULTI, "return a + b\n\ndef sub(a, b):\n", "return a + b\n\n",
     True),  # a dedent ends it
    ("def f(a, b):\n    ", "\n", "python", Mode.MULTI, "if a:\n        return a\n    return b\n",
     "if a:\n        return a\n    return b\n", False),  # still inside the block
    ("def f():", "\n", "python", Mode.MULTI, "\n    x = 1\n    return x\nprint(", "\n    x = 1\n    return x\n",
     True),  # the body of an opener
    ("function f() {\n  ", "\n", "javascript", Mode.MULTI, "return a;\n}\nfunction g() {\n", "return a;\n",
     True),  # a closing brace
    ("function f() {\n  ", "\n", "javascript", Mode.MULTI, "if (a) {\n    b();\n  }\n",
     "if (a) {\n    b();\n  }\n", False),
    # column 0 of a blank line inside a function: the block is the line below's
    ("def f(rows):\n    w = {}\n", "\n    return w\n", "python", Mode.MULTI,
     "    w[0] = 1\ndef g():\n", "    w[0] = 1\n", True),
    ("def f(rows):\n    w = {}\n", "\n    return w\n", "python", Mode.MULTI, "def g():\n", "", True),
    # the output meets the first code line below the cursor: it ends there
    ("def f(rows):\n    w = {}\n    ", "\n    # a comment\n    return w\n", "python", Mode.MULTI,
     "w[0] = 1\n    return w\n    x", "w[0] = 1\n", True),
    ("def f(rows):\n    w = {}\n    ", "\n    return w\n", "python", Mode.MULTI,
     "w[0] = 1\n    return w", "w[0] = 1\n    return w", False),  # that line is not complete yet
])
def test_where_a_streamed_suggestion_ends(head, tail, language, mode, streamed, kept, done):
    assert at_end(head, tail, language, mode).cut(streamed) == (kept, done)


def test_the_block_enclosing_the_cursor():
    assert enclosing_indent("    ") == 4 and enclosing_indent("def f():") == 1 and enclosing_indent("    x = 1") == 4
    assert Landing.at(BODY, BODY.index("    \n") + 4, "python").indent == 4
    assert next_code_line("x\n\n  # note\n  y = 1\n", 1, "python") == "  y = 1"
    assert next_code_line("x = 1", 3, "python") is None
    assert infill_mode("f(a, b)\n", 4) is Mode.SINGLE and infill_mode("f(\n", 2) is Mode.MULTI
    assert infill_mode("f(a)\n", 3) is Mode.MULTI  # only a closer follows


def test_the_final_fit():
    land = at_end("def f(a):\n    ")
    assert land.fit("return a\n\n\n") == "return a"  # no trailing blank lines
    assert land.fit("   \n   ") == ""  # whitespace only
    assert land.fit("return a\nprint(1)") == "return a"
    assert at_end("x = ", mode=Mode.SINGLE).fit("abc") == "abc"
    assert at_end("def f():\n    ", "\n    return 1\n").fit("return 1") == ""  # only repeats the line below
    # moved back to the cursor's level (fit.fit_indent), a line that then leaves the
    # block is cut too; fitting twice changes nothing
    text = "def f(a):\n    x = 1\n    "
    assert at_end(text).fit("    y = 2\n        z = 3\n\ndef g():\n    pass") == "y = 2\n    z = 3"
    once = at_end(text).fit("    y = 2\n    return y")
    assert once == "y = 2" and at_end(text).fit(once) == once


def test_the_end_does_not_move_as_the_output_grows():
    """A cut is judged on what a line already holds: a longer output ends at the same
    place, which is what makes the engine's stop lossless (test_stopping.py)."""
    land = at_end("def f(rows):\n    w = {}\n", "\n    return w\n")
    output = "    for r in rows:\n        w[r] = 1\n    return w\n\ndef g():\n    pass\n"
    ends = {land.end(output[:n]) for n in range(len(output) + 1)} - {None}
    assert ends == {(len("    for r in rows:\n        w[r] = 1\n"), len(output.split("\n\n")[0]) + 1)}


# -- the property, over real files ------------------------------------------------------

def real_files() -> list[Path]:
    import argparse
    import configparser
    import difflib
    import email.feedparser
    import json.decoder
    import textwrap

    return [Path(m.__file__) for m in (textwrap, json.decoder, email.feedparser, difflib, configparser, argparse)]


def cut_blocks(source: str) -> list[tuple[int, int, int]]:
    """(first line, end line, indentation) of every run of statements in a function
    body that is followed by more of that body: the blocks a test deletes."""
    tree, lines = ast.parse(source), source.split("\n")
    blocks = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and len(node.body) >= 3:
            first, last = node.body[1], node.body[-2]
            indent = len(lines[first.lineno - 1]) - len(lines[first.lineno - 1].lstrip())
            blocks.append((first.lineno - 1, last.end_lineno, indent))
    return blocks


def served_for(source: str, cursor_column: int, block: tuple[int, int, int], tail: str) -> tuple[str, str, int]:
    """(the text with the block replaced by a blank line, the cursor's offset, ...) and
    what the model writes there: the block, then `tail`."""
    lines = source.split("\n")
    start, end, indent = block
    text = "\n".join(lines[:start] + [" " * cursor_column] + lines[end:])
    offset = len("\n".join(lines[:start])) + 1 + cursor_column
    deleted = "\n".join(lines[start:end])
    return text, offset, deleted[cursor_column:] + "\n" + tail


TAILS = {
    "what followed": None,  # the rest of the original file
    "a top-level function": "\n\ndef other(x):\n    return x\n\n@decorator\n",
    "a dedented statement": "return None\n",
}


@pytest.mark.parametrize("tail", TAILS)
@pytest.mark.parametrize("column", ["block", 0])
def test_served_suggestions_stay_in_their_block_and_the_file_parses(tail, column):
    checked = 0
    for path in real_files():
        source = path.read_text(encoding="utf-8")
        for block in cut_blocks(source)[:25]:
            cursor = block[2] if column == "block" else 0
            rest = "\n".join(source.split("\n")[block[1]:]) if TAILS[tail] is None else TAILS[tail]
            text, offset, output = served_for(source, cursor, block, rest)
            land = Landing.at(text, offset, "python")
            served = land.fit(output)
            for i, line in enumerate((text[text.rfind("\n", 0, offset) + 1: offset] + served).split("\n")):
                if line.strip():
                    assert len(line) - len(line.lstrip()) >= block[2], (path.name, block, served)
            ast.parse(text[:offset] + served + text[offset:])
            checked += 1
    assert checked > 100


def scripted_document(text: str, output: str) -> str:
    """`text` with the scripted backend's answer on its first line (tests/lsp/scripted.py)."""
    return "#> " + json.dumps(output) + "\n" + text
