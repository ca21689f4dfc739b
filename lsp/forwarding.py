"""The forwarding cache's rule: the completion shown last in a document still holds while
the person types (or accepts) along it, and its rest is the next answer (the language
server keeps one `Shown` per document; lsp/completion.py reads it)."""

from __future__ import annotations

from dataclasses import dataclass

from codespec.landing.syntax import Mode


@dataclass
class Shown:
    """The completion shown last in a document, for the forwarding cache."""

    prefix: str  # the document text before the cursor when it was computed
    text: str
    mode: Mode = Mode.MULTI  # the request's mode and block (landing/cut.py): its rest is cut by them again
    indent: int = 0


def along(shown: Shown | None, prefix: str) -> bool:
    """The text before the cursor is where `shown` was computed plus a start of its text:
    the person typed (or accepted) along it."""
    return shown is not None and prefix.startswith(shown.prefix) and \
        shown.text.startswith(prefix[len(shown.prefix) :])


def forward(shown: Shown | None, prefix: str) -> str | None:
    """The rest of the completion shown last, if the user typed along it.

    >>> forward(Shown("def f():\\n    ", "return 1\\n"), "def f():\\n    ret")
    'urn 1\\n'
    """
    if not along(shown, prefix):
        return None
    assert shown is not None
    typed = prefix[len(shown.prefix) :]
    if len(typed) >= len(shown.text.rstrip()):
        return None
    return shown.text[len(typed) :]
