"""Next-edit suggestions over LSP: `textDocument/copilotInlineEdit`, the custom method
Neovim's copilot-lsp and sidekick.nvim (and Copilot's other clients) already speak.

    request  {textDocument: {uri, version}, position}
    result   {edits: [{text, range, textDocument: {uri, version}, command}]}

The server keeps each document's recent edits (nextedit/history.py, fed by didOpen and
didChange) and asks its backend for the edit the model predicts after them
(`CompletionBackend.next_edit`): the model rewrites the lines around the cursor and the
changes are diffed out. Copilot's `edits` are alternatives, not a sequence, so the
changes of one rewrite come as one edit spanning them. A stale `version` gets no edit;
`textDocument/didShowInlineEdit` counts the edit as shown, its command (run on accept)
as accepted. The server advertises the method as `experimental.copilotInlineEdit`.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from lsprotocol import types
from pygls.exceptions import JsonRpcInvalidParams
from pygls.workspace import ServerTextPosition

from codespec.lsp.documents import open_document, text_of
from codespec.nextedit.history import Change
from codespec.nextedit.prompt import NextEditRequest
from codespec.nextedit.rewrite import merged, position

METHOD = "textDocument/copilotInlineEdit"
SHOWN = "textDocument/didShowInlineEdit"
ACCEPT_EDIT = "codespec.acceptInlineEdit"
CAPABILITY = "copilotInlineEdit"  # experimental.copilotInlineEdit: true


def field(params: Any, *path: str) -> Any:
    """`params.a.b` of a custom method's params (pygls hands them as attribute objects;
    a dict is read too). None where missing."""
    value = params
    for name in path:
        value = value.get(name) if isinstance(value, dict) else getattr(value, name, None)
        if value is None:
            return None
    return value


async def inline_edit(ls: Any, params: Any) -> dict[str, Any]:
    uri, version = field(params, "textDocument", "uri"), field(params, "textDocument", "version")
    line, character = field(params, "position", "line"), field(params, "position", "character")
    if not isinstance(uri, str) or not isinstance(line, int) or not isinstance(character, int) \
            or line < 0 or character < 0:
        raise JsonRpcInvalidParams(f"{METHOD} takes textDocument.uri and a position (line and character)")
    if ls.backend is None and ls.loading is not None:
        await asyncio.shield(ls.loading)
    if not ls.options.enable or ls.backend is None:
        return {"edits": []}
    doc = open_document(ls, uri)
    if version is not None and doc.version is not None and version != doc.version:
        return {"edits": []}  # asked about a text the document no longer has
    if line > len(doc.lines):
        raise JsonRpcInvalidParams(f"position {line}:{character} is outside the document ({len(doc.lines)} lines)")
    text = text_of(doc)
    offset = _normalized(doc.source, doc.offset_at_position(types.Position(line, character)))
    # every document's recent changes, oldest first, named by their paths in the workspace
    history = [Change(ls.relative_path(c.uri), c.start, c.before, c.after) for c in ls.history.recent()]
    asked = NextEditRequest(ls.relative_path(uri), text, offset, history)
    found = await ls.backend.next_edit(asked)
    if not found:
        return {"edits": []}
    first, last, span = merged(text, found)
    key = uuid.uuid4().hex
    return {"edits": [{
        "text": span,
        "range": {"start": _client(doc, text, first), "end": _client(doc, text, last)},
        "textDocument": {"uri": uri, "version": doc.version},
        "command": {"title": "Accept the next edit", "command": ACCEPT_EDIT, "arguments": [key]},
    }]}


def _normalized(source: str, offset: int) -> int:
    """An offset into the document's source as an offset into its text with "\\r\\n" as "\\n"."""
    return offset - source.count("\r\n", 0, offset)


def _client(doc: Any, text: str, offset: int) -> dict[str, int]:
    """An offset into the document's text ("\\r\\n" as "\\n": lines and columns are the
    source's) as the client's position (UTF-16 units unless negotiated)."""
    found = doc.position_to_client_units(ServerTextPosition(*position(text, offset)))
    return {"line": found.line, "character": found.character}
