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


def remember(ls: Any, uri: str) -> None:
    """The document's text into its edit history (next edits see the changes)."""
    doc = opened(ls, uri)
    if doc is not None:
        ls.history.update(uri, doc.source.replace("\r\n", "\n"))


def feed(ls: Any, uri: str, saved: bool = False) -> None:
    doc = opened(ls, uri)
    if ls.backend is None or doc is None:
        return
    ls.backend.update_document(ls.relative_path(uri), doc.source.replace("\r\n", "\n"), saved)
