"""Every suggestion the language server serves is cut for the request it answers, on
every path: generated for it, forwarded from the one shown last (asked again, typed
along), computed ahead after an accept, finished in the background after an early
answer. Over the real server with the scripted backend (tests/lsp/scripted.py), whose
"model" writes a block cut out of a real function and then keeps going past it.

The replay: a suggestion on a blank line inside a function, Tab, undo, ask again at the
same place (at the block's column and at column 0): what is served stays inside the
function, and the file with it accepted parses."""

from __future__ import annotations

import ast
import asyncio
import json

import pytest
from lsprotocol import types

from tests.lsp.test_cut import TAILS, cut_blocks, real_files, served_for
from tests.lsp.test_editor_fit import Editor, run

CASES_PER_FILE = 3


def cases() -> list[tuple[str, str, int, int]]:
    """(name, text with the scripted answer, cursor offset, the block's indentation)."""
    out = []
    for path in real_files():
        source = path.read_text(encoding="utf-8")
        for n, block in enumerate(cut_blocks(source)[:CASES_PER_FILE]):
            for tail_name, tail in TAILS.items():
                for column in (block[2], 0):
                    rest = "\n".join(source.split("\n")[block[1]:]) if tail is None else tail
                    text, offset, output = served_for(source, column, block, rest)
                    # the script goes on a comment line right above the cursor's (a comment
                    # changes no block), so that it is inside the prompt's window
                    line_start = text.rfind("\n", 0, offset) + 1
                    comment = " " * block[2] + "#> " + json.dumps(output) + "\n"
                    out.append((f"{path.stem}-{n}-{tail_name}-{column}", text[:line_start] + comment + text[line_start:],
                                offset + len(comment), block[2]))
    return out


def check(name: str, text: str, offset: int, indent: int, served: str, parses: bool = True) -> None:
    line_start = text.rfind("\n", 0, offset) + 1
    for line in (text[line_start:offset] + served).split("\n"):
        assert not line.strip() or len(line) - len(line.lstrip()) >= indent, (name, served)
    if parses:
        ast.parse(text[:offset] + served + text[offset:])  # accepted, the file parses


def insert(item: types.InlineCompletionItem) -> str:
    return item.insert_text if isinstance(item.insert_text, str) else item.insert_text.value


async def replay(ed: Editor, name: str, text: str, offset: int, indent: int, whole: bool) -> int:
    """Ask (fresh), ask again (forwarded), Tab and its accept command (ahead), undo, ask
    again at the same place: each answer checked (`whole`: answers are whole blocks, so
    the file parses with each). Returns the answers checked."""
    uri = ed.open(f"{name}.py", text)
    checked = 0
    for _ in range(2):  # fresh, then from the forwarding cache
        result = await ed.ask(uri, text, offset)
        if result is None or not result.items:
            return checked
        item = result.items[0]
        check(name, text, offset, indent, insert(item), whole)
        checked += 1
    accepted = text[:offset] + insert(item)
    ed.change(uri, accepted + text[offset:])
    await ed.client.workspace_execute_command_async(types.ExecuteCommandParams(
        command=item.command.command, arguments=item.command.arguments))
    # right after Tab: the ahead path (the scripted "model" writes its block again there,
    # which need not make sense at the end of a line: only the block is checked)
    ahead = await ed.ask(uri, accepted + text[offset:], len(accepted))
    if ahead is not None and ahead.items:
        check(name, accepted + text[offset:], len(accepted), indent, insert(ahead.items[0]), parses=False)
    ed.change(uri, text)  # undo
    await asyncio.sleep(0.05)
    again = await ed.ask(uri, text, offset)
    if again is not None and again.items:
        check(name, text, offset, indent, insert(again.items[0]), whole)
        checked += 1
    if len(insert(item)) > 4:  # typed along the first characters: the rest, forwarded, cut again
        typed = text[:offset] + insert(item)[:3]
        ed.change(uri, typed + text[offset:])
        along = await ed.ask(uri, typed + text[offset:], len(typed))
        if along is not None and along.items:
            check(name, typed + text[offset:], len(typed), indent, insert(along.items[0]), whole)
            checked += 1
    return checked


# 1 ms: answered early with the whole lines ready (a block's first lines need not parse
# alone: a `try:` before its `except`), the rest finished in the background
@pytest.mark.parametrize("budget_ms", [0, 1])
def test_every_path_serves_only_what_fits_its_block(tmp_path, budget_ms):
    async def case(ed: Editor) -> None:
        checked = 0
        for name, text, offset, indent in cases():
            checked += await replay(ed, name, text, offset, indent, whole=budget_ms == 0)
        assert checked > 50

    run(case, tmp_path, "--char-s", "0" if budget_ms == 0 else "0.0002", options={"latencyBudgetMs": budget_ms})
