"""`textDocument/copilotInlineEdit` over the real language server with a scripted
backend (tests/lsp/scripted.py): the edit history from didChange, one edit spanning the
rewrite's changes in client positions, the capability, stale versions, telemetry."""

from __future__ import annotations

import asyncio

from lsprotocol import types

from tests.lsp.test_editor_fit import ANSWER_S, Editor, editor, stop_client

BEFORE = "def area(width, height):\n    check(width)\n    return width * height\n"
AFTER = BEFORE.replace("area(width,", "area(w,")


async def ask(ed: Editor, uri: str, line: int, character: int, version: int | None) -> dict:
    params = {"textDocument": {"uri": uri, "version": version}, "position": {"line": line, "character": character}}
    answer = await asyncio.wait_for(ed.client.protocol.send_request_async("textDocument/copilotInlineEdit", params),
                                    ANSWER_S)
    return answer if isinstance(answer, dict) else {"edits": [
        {"text": e.text, "range": {"start": {"line": e.range.start.line, "character": e.range.start.character},
                                   "end": {"line": e.range.end.line, "character": e.range.end.character}},
         "textDocument": {"uri": e.textDocument.uri, "version": e.textDocument.version},
         "command": {"command": e.command.command, "arguments": list(e.command.arguments)}}
        for e in answer.edits]}


def test_a_rename_is_followed_by_an_edit_of_its_uses(tmp_path):
    async def session() -> None:
        client, ed = await editor(tmp_path)
        try:
            assert client.initialized_with.capabilities.experimental == {"copilotInlineEdit": True}
            assert "codespec.acceptInlineEdit" in client.initialized_with.capabilities.execute_command_provider.commands
            uri = ed.open("area.py", BEFORE)
            ed.change(uri, AFTER)
            answer = await ask(ed, uri, 0, 10, ed.version)
            (edit,) = answer["edits"]
            assert edit["range"] == {"start": {"line": 1, "character": 10}, "end": {"line": 2, "character": 16}}
            assert edit["text"] == "w)\n    return w"
            assert edit["textDocument"] == {"uri": uri, "version": ed.version}
            assert edit["command"]["command"] == "codespec.acceptInlineEdit"
            client.protocol.notify("textDocument/didShowInlineEdit", {"item": {"command": edit["command"]}})
            await client.workspace_execute_command_async(types.ExecuteCommandParams(
                command=edit["command"]["command"], arguments=edit["command"]["arguments"]))
            assert (await ask(ed, uri, 0, 10, ed.version - 1))["edits"] == []  # stale: asked about an old text
        finally:
            await stop_client(client)

    asyncio.run(session())
