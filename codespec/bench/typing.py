"""A person writing code, as events an editor sends: the typing replay behind `codespec
bench editor`.

Real functions of standard-library modules codespec uses nowhere else (`colorsys`,
`statistics`, `bisect`), so every machine has them offline and no index holds them. For
each function, in a file opened for it (a file met again is closed and reopened, as
people switch files), the body is removed and then typed line by line: a completion is
asked for at the start of each new line (after its indentation, as editors indent) and
in the middle of each longer line, and the typed text is sent as a change before the
next request. Files of the same modules, without the functions being written, form the
workspace the servers index.

    replay = typing_replay()
    for event in replay.events: ...          # Open, Close, Ask, Type
    score(event, suggestion)                 # first-line match, characters accepted
"""

from __future__ import annotations

import ast
import importlib
import inspect
from dataclasses import dataclass, field
from pathlib import Path

# (module, function): short real functions, each 4-25 body lines
FUNCTIONS: tuple[tuple[str, str], ...] = (
    ("colorsys", "rgb_to_hls"),
    ("statistics", "median_low"),
    ("bisect", "insort_right"),
    ("colorsys", "hls_to_rgb"),
    ("statistics", "mode"),
    ("bisect", "bisect_left"),
)
MID_LINE_MIN_CHARS = 16  # lines at least this long also get a request half-way through


@dataclass(frozen=True)
class Open:
    path: str
    text: str


@dataclass(frozen=True)
class Close:
    path: str


@dataclass(frozen=True)
class Type:
    """The document's whole text after the person typed some more."""

    path: str
    text: str


@dataclass(frozen=True)
class Ask:
    """A completion request at `offset` of the document's current text; `truth` is what
    the person goes on to type there (the rest of the function), `first` marks the first
    request after the file was opened."""

    path: str
    text: str
    offset: int
    truth: str
    kind: str  # "line-start" or "mid-line"
    first: bool = False

    @property
    def line(self) -> int:
        return self.text.count("\n", 0, self.offset)

    @property
    def character(self) -> int:
        return self.offset - (self.text.rfind("\n", 0, self.offset) + 1)


@dataclass
class Replay:
    events: list[Open | Close | Type | Ask]
    workspace: dict[str, str] = field(default_factory=dict)  # path -> text: the files as they start

    @property
    def asks(self) -> list[Ask]:
        return [e for e in self.events if isinstance(e, Ask)]


def _source(module: str) -> str:
    return inspect.getsource(importlib.import_module(module))


def _function(source: str, name: str) -> ast.FunctionDef:
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise LookupError(f"no function {name}")


def _body_span(source: str, name: str) -> tuple[int, int]:
    """The lines of `name`'s body after its docstring (people write the docstring first)."""
    fn = _function(source, name)
    start = fn.body[0].lineno - 1
    if isinstance(fn.body[0], ast.Expr) and isinstance(getattr(fn.body[0], "value", None), ast.Constant):
        start = fn.body[0].end_lineno or start
    return start, fn.end_lineno or start


def _without(source: str, names: list[str]) -> str:
    """The module as the person starts: the bodies of the functions still to write are a
    `pass` (so that the module still parses)."""
    lines = source.splitlines(keepends=True)
    for start, end in sorted((_body_span(source, n) for n in names), reverse=True):
        lines[start:end] = [_indent(lines[start]) + "pass\n"]
    return "".join(lines)


def typing_replay(functions: tuple[tuple[str, str], ...] = FUNCTIONS, limit: int | None = None) -> Replay:
    """The replay; `limit` keeps the first `limit` requests (a quick run)."""
    events: list[Open | Close | Type | Ask] = []
    todo: dict[str, list[str]] = {}
    for module, name in functions:
        todo.setdefault(module, []).append(name)
    # on disk (what the servers index) every function still to write is an empty body
    workspace = {f"{m}.py": _without(_source(m), names) for m, names in todo.items()}
    opened: str | None = None
    for module, name in functions:
        todo[module].remove(name)
        path = f"{module}.py"
        # the editor's buffer: the functions written so far, this one empty, later ones too
        source = _without(_source(module), todo[module])
        start, end = _body_span(source, name)
        lines = source.splitlines(keepends=True)
        head, body, tail = "".join(lines[:start]), lines[start:end], "".join(lines[end:])
        if opened is not None:
            events.append(Close(opened))
        typed = ""
        events.append(Open(path, head + (_indent(body[0]) if body else "    ") + "\n" + tail))
        opened, first = path, True
        for line in body:
            indent = _indent(line)
            code = line[len(indent):].rstrip("\n")
            text = head + typed + indent + "\n" + tail
            events.append(Type(path, text))
            at = len(head) + len(typed) + len(indent)
            rest = "".join(body)[len(typed) + len(indent):]
            if code:
                events.append(Ask(path, text, at, rest, "line-start", first))
                first = False
            if len(code) >= MID_LINE_MIN_CHARS:
                half = len(code) // 2
                text = head + typed + indent + code[:half] + "\n" + tail
                events.append(Type(path, text))
                events.append(Ask(path, text, at + half, rest[half:], "mid-line"))
            typed += line
        events.append(Type(path, head + typed + tail))
    if limit is not None:
        events = _first_asks(events, limit)
    return Replay(events, workspace)


def _first_asks(events: list[Open | Close | Type | Ask], limit: int) -> list[Open | Close | Type | Ask]:
    kept, asks = [], 0
    for event in events:
        if isinstance(event, Ask):
            if asks == limit:
                break
            asks += 1
        kept.append(event)
    return kept


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip(" \t"))] if line.strip() else ""


@dataclass(frozen=True)
class Score:
    first_line_exact: bool
    chars_accepted: int


def score(ask: Ask, suggestion: str | None) -> Score:
    """How good a suggestion is for what the person then typed. The first line is exact
    when it equals the rest of the line being typed (trailing spaces aside); characters
    accepted are the suggestion's leading characters that match the text typed next (what
    Tab, then typing along, keeps)."""
    if not suggestion:
        return Score(False, 0)
    want_line = ask.truth.split("\n", 1)[0].rstrip()
    got_line = suggestion.split("\n", 1)[0].rstrip()
    same = 0
    for a, b in zip(suggestion, ask.truth):
        if a != b:
            break
        same += 1
    return Score(bool(want_line) and got_line == want_line, same)


def write_workspace(root: Path, replay: Replay) -> Path:
    """The files as the servers index them: without the bodies still to be written."""
    root.mkdir(parents=True, exist_ok=True)
    for path, text in replay.workspace.items():
        (root / path).write_text(text, encoding="utf-8")
    return root
