"""What to complete: nothing, one line or a block, decided from the text around the cursor.

`classify` decides before any model work, from the text around the cursor and a
tree-sitter parse: no completion in the middle of a word; one line when text follows
the cursor on its line, or inside a string or comment; otherwise several lines (a
blank line, or the end of a line that opens a block). Where a completion ends is
`lsp.cut.Landing`'s. `repeats_following` drops a suggestion that only repeats the
lines after the cursor.

>>> text = "def add(a, b):\\n    \\n"
>>> classify(text, text.index("\\n") + 5, "python")
<Mode.MULTI: 'multi'>
>>> classify("total = valu", 12, "python")   # the end of a line that opens nothing
<Mode.SINGLE: 'single'>
>>> classify("total = value", 10, "python")  # va|lue: mid-word
<Mode.NONE: 'none'>
"""

from __future__ import annotations

import enum
import functools
import importlib
from typing import Any

GRAMMARS = {  # language id -> (module of the grammar wheel, attribute)
    "python": ("tree_sitter_python", "language"),
    "javascript": ("tree_sitter_javascript", "language"),
    "javascriptreact": ("tree_sitter_javascript", "language"),
    "typescript": ("tree_sitter_typescript", "language_typescript"),
    "typescriptreact": ("tree_sitter_typescript", "language_tsx"),
}
INDENTED = {"python"}  # blocks end by indentation; other languages by brackets
BLOCK_OPENERS = (":", "{", "(", "[", "=>", "->")
CLOSERS = ")]}\"'`;,"
TEXT_NODES = ("string", "comment", "template_string", "string_content", "line_comment", "block_comment")
MAX_LINES = 64


class Mode(enum.Enum):
    NONE = "none"
    SINGLE = "single"
    MULTI = "multi"


@functools.cache
def parser_for(language_id: str) -> Any:
    """A tree-sitter parser for the language, or None without a grammar wheel."""
    if language_id not in GRAMMARS:
        return None
    try:
        from tree_sitter import Language, Parser

        module, attr = GRAMMARS[language_id]
        return Parser(Language(getattr(importlib.import_module(module), attr)()))
    except (ImportError, AttributeError, ValueError):
        return None


def _is_word(ch: str) -> bool:
    return ch.isalnum() or ch == "_"


def in_string_or_comment(text: str, offset: int, language_id: str) -> bool:
    parser = parser_for(language_id)
    if parser is None:
        return False
    data = text.encode("utf-8")
    point = len(text[:offset].encode("utf-8"))
    node = parser.parse(data).root_node.descendant_for_byte_range(max(point - 1, 0), point)
    while node is not None:
        if node.type in TEXT_NODES and node.start_byte < point < node.end_byte + (node.type.endswith("comment")):
            return True
        node = node.parent
    return False


def classify(text: str, offset: int, language_id: str) -> Mode:
    line_start = text.rfind("\n", 0, offset) + 1
    line_end = text.find("\n", offset)
    before = text[line_start:offset]
    after = text[offset : len(text) if line_end < 0 else line_end]
    if before and after and _is_word(before[-1]) and _is_word(after[0]):
        return Mode.NONE  # mid-word: the user is editing an identifier
    if after.strip(" \t\r") and after.strip(" \t\r")[0] not in CLOSERS:
        return Mode.SINGLE
    if not before.strip():
        return Mode.MULTI
    if in_string_or_comment(text, offset, language_id):
        return Mode.SINGLE
    return Mode.MULTI if before.rstrip().endswith(BLOCK_OPENERS) else Mode.SINGLE


def bracket_depth(text: str) -> int:
    """Brackets `text` opens less those it closes.

    >>> bracket_depth("f(a, [1, 2]"), bracket_depth("x)")
    (1, -1)
    """
    return sum(text.count(c) for c in "([{") - sum(text.count(c) for c in ")]}")


def indentation(line: str) -> int:
    return len(line.replace("\t", "    ")) - len(line.replace("\t", "    ").lstrip(" "))


def repeats_following(completion: str, text: str, offset: int) -> bool:
    """True when the completion's lines only repeat what follows the cursor."""
    mine = [line.strip() for line in completion.strip().splitlines() if line.strip()]
    if not mine:
        return True
    following = [line.strip() for line in text[offset:].splitlines() if line.strip()][: len(mine)]
    return mine == following
