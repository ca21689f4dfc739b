"""Lines a completion may show: the whitespace typed at the cursor that the prompt holds
back (`HeldSpace`), and the complete lines of a completion still being written
(`whole_lines`)."""

from __future__ import annotations

from codespec.landing.syntax import bracket_depth


class HeldSpace:
    """Whitespace typed at the end of the middle, held back from the prompt.

    A prompt that ends in spaces makes the model start a token boundary where its
    tokenizer never has one (indentation and the word after it are one token), and it
    answers with one space too many (` maxc = ...` after an indent). So the prompt's
    middle ends before that whitespace, the model writes it itself, and the completion
    shown starts after it. A model that writes other whitespace there disagrees with
    where the cursor is: no completion.

    >>> held = HeldSpace("    ")
    >>> held.heal("  "), held.heal("    return x"), held.heal("return x"), held.heal("\\n")
    ('', 'return x', None, None)
    """

    def __init__(self, typed: str) -> None:
        self.text = typed[len(typed.rstrip(" \t")) :]

    @staticmethod
    def split(middle: str) -> tuple[str, HeldSpace]:
        """(the middle to send, what it holds back)."""
        held = HeldSpace(middle)
        return middle[: len(middle) - len(held.text)], held

    def heal(self, raw: str) -> str | None:
        """The completion after the cursor; "" while the model is still writing the
        held whitespace, None when it wrote something else."""
        if raw.startswith(self.text):
            return raw[len(self.text) :]
        return "" if self.text.startswith(raw) else None


def whole_lines(text: str) -> str:
    """The longest run of complete lines of `text` that closes every bracket it opens and
    does not end on a block's header: what a completion answered before its generation
    ends may show (never a suggestion cut inside an unclosed `return (`, nor
    one that ends on an `if s:` whose body is still to come).

    >>> whole_lines("x = f(1,\\n      2)\\ny = [\\n")
    'x = f(1,\\n      2)'
    >>> whole_lines("return (")
    ''
    >>> whole_lines("n = len(s)\\nif not s:\\n")
    'n = len(s)'
    """
    kept, depth, at = "", 0, 0
    while True:
        end = text.find("\n", at)
        if end < 0:
            return kept
        line = text[at:end]
        depth += bracket_depth(line)
        if depth <= 0 and not line.rstrip().endswith(("\\", ":")):
            kept = text[:end]
        at = end + 1
