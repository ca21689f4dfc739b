"""The prompt's window around the cursor, laid out so that typing invalidates as little
of the server's cached KV as possible.

The KV prefix cache reuses a prompt's leading tokens only while they stay the same. A
window that keeps "the last N characters before the cursor" starts one character later
at every keystroke, so in any file longer than N nothing is ever reused and every
request prefills the whole prompt again. Here the window's start snaps to a grid that
moves in steps of a quarter of the budget, at a line start: while the person types, the
start stays put and consecutive requests share everything before the edit point. The
window holds between three quarters and all of its budget.

    >>> text = "".join(f"line {i}\\n" for i in range(100))
    >>> window = prefix_window(text, 200)
    >>> window == prefix_window(text + "x = 1", 200)[: len(window)]   # typing keeps the start
    True
    >>> 150 <= len(window) <= 200 and window.startswith("line ")
    True
"""

from __future__ import annotations

from typing import Any

from codespec.landing.lines import HeldSpace
from codespec.lsp.backend import FimRequest
from codespec.prompts import ExtraFile, grid_start

# The character cut before tokenizing: generous (code runs ~3.5 characters a token), so
# that the backend's token cut, on its own grid (prompts.grid_start), does the real work
# and the character window's start (which moves every quarter window) rarely moves:
# each move of either start is a prompt the KV cache cannot reuse. A backend that does
# not cut by tokens (`codespec serve`'s /infill) gets the tighter HTTP_CHARS_PER_TOKEN.
CHARS_PER_TOKEN = 16
HTTP_CHARS_PER_TOKEN = 4


def fim_request(text: str, offset: int, options: Any, path: str = "",
                extra: tuple[ExtraFile, ...] = ()) -> tuple[FimRequest, HeldSpace]:
    """The completion request for a cursor at `offset` of `text` (`options`: LspOptions):
    the window before the cursor's line, the typed part of the line as the FIM middle
    (see FimRequest.middle) less its trailing whitespace, the window after the cursor;
    `extra`, other files' code (lsp/context.py)."""
    prefix = text[:offset]
    line_start = prefix.rfind("\n") + 1
    middle, held = HeldSpace.split(prefix[line_start:])
    request = FimRequest(
        prefix_window(prefix[:line_start], options.prefix_tokens * CHARS_PER_TOKEN),
        suffix_window(text[offset:], options.suffix_tokens * CHARS_PER_TOKEN),
        options.max_tokens, path, options.prefix_tokens, options.suffix_tokens, middle, options.fim_layout, extra,
    )
    return request, held


def prefix_window(before: str, budget_chars: int) -> str:
    """The text before the cursor that the prompt keeps: from a grid-snapped line start."""
    start = grid_start(len(before), budget_chars)
    if start == 0:
        return before
    line = before.find("\n", start - 1)  # the first line that starts at or after the grid point
    if line == -1 or line + 1 >= len(before):  # one huge line: the grid point itself
        return before[start:]
    return before[line + 1 :]


def suffix_window(after: str, budget_chars: int) -> str:
    """The text after the cursor that the prompt keeps: typing at the cursor does not
    change it (its end is budget characters past the cursor, in text that moves along)."""
    return after[:budget_chars]
