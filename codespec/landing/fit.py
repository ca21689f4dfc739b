"""Fitting a finished completion to the line the editor holds.

Three things editors do around the cursor that a completion must respect:

- **Auto-closed brackets.** After `assert callable(` VS Code has already inserted `)`:
  the cursor sits before it. A completion that closes that bracket itself
  (`include) == names`) must replace the editor's `)`, not land before it and double it.
  `replaced_after` says how much of the line after the cursor the item's range covers.
- **Indentation.** On a blank line the editor has already indented the cursor. A model
  that indents one level too deep there (8 spaces where the block is at 4) gives an
  `IndentationError` once accepted; `fit_indent` moves the completion back to the
  cursor's level where Python's rules say that level is the only one possible.
- **The token limit.** A completion cut by `maxTokens` can stop inside an unclosed
  `return (`. `closed` keeps its complete lines only (`lines.whole_lines`).

>>> replaced_after("include) == names", ")")
1
>>> replaced_after("include", ")")
0
>>> fit_indent("    return x\\n    y = 1", "def f(a):\\n    a += 1\\n    ", 25, "python")
'return x\\ny = 1'
>>> closed("x = 1\\nreturn (a +")
'x = 1'
"""

from __future__ import annotations

from codespec.landing.syntax import BLOCK_OPENERS, CLOSERS, INDENTED, bracket_depth, indentation
from codespec.landing.lines import whole_lines

OPEN, CLOSE = "([{", ")]}"
QUOTES = "\"'`"


def rest_of_line(text: str, offset: int) -> str:
    end = text.find("\n", offset)
    return text[offset : len(text) if end < 0 else end]


def replaced_after(completion: str, rest: str) -> int:
    """How many characters after the cursor the completion's item replaces: all of the
    rest of the line when that rest is closers only (`)`, `")`, `]);`) and the
    completion writes each of them itself, in order, where it closes something opened
    before the cursor; else 0 (the completion goes in before them)."""
    wanted = rest.rstrip(" \t\r")
    if not wanted or wanted.lstrip(" \t") != wanted or any(c not in CLOSERS for c in wanted):
        return 0
    depth, quotes, at = 0, {q: 0 for q in QUOTES}, 0
    for ch in completion.split("\n", 1)[0]:
        if ch in OPEN:
            depth += 1
        elif ch in CLOSE:
            depth -= 1
        elif ch in QUOTES:
            quotes[ch] += 1
        if at < len(wanted) and ch == wanted[at] and _closes_outer(ch, depth, quotes):
            at += 1
    return len(rest) if at == len(wanted) else 0


def _closes_outer(ch: str, depth: int, quotes: dict[str, int]) -> bool:
    """`ch`, just read, closes something the completion did not open."""
    if ch in CLOSE:
        return depth < 0
    if ch in QUOTES:
        return quotes[ch] % 2 == 1  # an unmatched quote of the completion's own
    return True  # `;` and `,`: any


def fit_indent(completion: str, text: str, offset: int, language_id: str) -> str:
    """`completion` moved back to the cursor's indentation when the cursor is on a
    blank line of an indentation-ruled language, the completion's first line is
    indented further, and Python allows no deeper line there (the code line above does
    not open a block); every line of the completion moves by the same amount."""
    if language_id not in INDENTED:
        return completion
    line_start = text.rfind("\n", 0, offset) + 1
    if text[line_start:offset].strip():
        return completion
    extra = len(completion) - len(completion.lstrip(" "))
    if not extra:
        return completion
    above = [line for line in text[:line_start].split("\n") if line.strip()]
    if not above or above[-1].rstrip().endswith(BLOCK_OPENERS):
        return completion  # a block opens: the deeper line may be its body
    cursor = indentation(text[line_start:offset])
    if cursor + extra <= indentation(above[-1]):
        return completion  # a dedent back to an enclosing level is legal
    lines = completion.split("\n")
    if any(line.strip() and indentation(line) < extra for line in lines[1:]):
        return completion  # it leaves the block further down: moving it would change that
    return "\n".join(line[extra:] if line.strip() else line.lstrip(" ") for line in lines)


def closed(completion: str) -> str:
    """`completion` without a last, unfinished statement: all of it when the brackets it
    opens are closed, else its complete lines that close theirs."""
    if bracket_depth(completion) <= 0 and not completion.rstrip().endswith("\\"):
        return completion
    return whole_lines(completion)
