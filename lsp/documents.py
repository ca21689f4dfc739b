"""The documents the editor opened, as the language server's handlers read them: only
what the editor sent (never a file read from disk), its text with "\\n" line ends fed to
the backend and to the edit history."""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

from pygls.exceptions import JsonRpcInvalidParams


def opened(ls: Any, uri: str) -> Any:
    """The document if the editor opened it, else None. Never `get_text_document`: it
    reads a document it does not hold from disk (any path a client names)."""
    return ls.workspace.text_documents.get(unquote(uri))


def open_document(ls: Any, uri: str) -> Any:
    """A document the editor opened; anything else (a path never opened, a file the
    server would have to read from disk) is refused with `InvalidParams`."""
    doc = opened(ls, uri)
    if doc is None:
        raise JsonRpcInvalidParams(f"{uri} is not open: send textDocument/didOpen first")
    return doc


def text_of(doc: Any) -> str:
    """A document's text with "\\n" line ends: what prompts, the index and the edit history read."""
    return doc.source.replace("\r\n", "\n")


def changed(ls: Any, uri: str) -> None:
    """An opened or edited document: its text, made once, to the backend (drafts, the
    index) and to its edit history (next edits see the changes)."""
    doc = opened(ls, uri)
    if doc is None:
        return
    text = text_of(doc)
    if ls.backend is not None:
        ls.backend.update_document(ls.relative_path(uri), text, False)
    ls.history.update(uri, text)


def feed(ls: Any, uri: str, saved: bool = False) -> None:
    doc = opened(ls, uri)
    if ls.backend is None or doc is None:
        return
    ls.backend.update_document(ls.relative_path(uri), text_of(doc), saved)
