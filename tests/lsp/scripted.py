"""`codespec lsp` with a scripted backend, for the editor-facing behaviour that a model's
own choices would make flaky: the server, its protocol and every step after the model
are the real ones; only the text comes from the document.

The backend answers with the JSON string after the last `#> ` in the text before the
cursor (`#> "include) == names"`), streamed a character at a time (`--char-s` apart),
after a model load of `--load-s`. Its next edit repeats the last recent change: the
word it replaced, replaced the same way wherever else the document has it. Run:
`python -m tests.lsp.scripted --load-s 2`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import time
from typing import Any

from codespec.cli.lsp import configure_logging, serve
from codespec.lsp.backend import FimRequest, OnText, Progress
from codespec.lsp.server import build_server
from codespec.nextedit.rewrite import Edit

MARK = "#> "


class ScriptedBackend:
    def __init__(self, char_s: float, journal: str | None = None) -> None:
        self.char_s = char_s
        self.journal = journal
        self.requests: list[FimRequest] = []

    async def complete(self, request: FimRequest, on_text: OnText) -> str:
        self.requests.append(request)
        if self.journal:  # for a test in another process: one line per request
            with open(self.journal, "a") as out:
                out.write(json.dumps({"path": request.path, "prefix": request.prefix}) + "\n")
        before = request.prefix + request.middle
        at = before.rfind(MARK)
        script = json.loads(before[at + len(MARK):].split("\n", 1)[0]) if at >= 0 else ""
        text = ""
        for ch in script:
            await asyncio.sleep(self.char_s)
            text += ch
            if not on_text(text):
                break
        return text

    async def next_edit(self, asked: Any) -> list[Edit]:
        if not asked.history:
            return []
        change = asked.history[-1]
        old, new = _replaced(change.before, change.after)
        if not old:
            return []
        return [Edit(found.start(), found.end(), new) for found in re.finditer(rf"\b{re.escape(old)}\b", asked.document)]

    async def index_workspace(self, folders: list[str], progress: Progress) -> str:
        progress("scripted", 100)
        return "0 files (scripted)"

    def update_document(self, path: str, text: str, saved: bool = False) -> None:
        pass

    def record_acceptance(self, accepted: bool) -> None:
        pass

    def close(self) -> None:
        return None


def _replaced(before: str, after: str) -> tuple[str, str]:
    """The word a one-word change replaced, and what it became."""
    head = len(os.path.commonprefix([before, after]))
    tail = len(os.path.commonprefix([before[head:][::-1], after[head:][::-1]]))
    while head and (before[head - 1].isalnum() or before[head - 1] == "_"):
        head -= 1  # the whole word, not the changed letters alone
    return before[head: len(before) - tail], after[head: len(after) - tail]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--load-s", type=float, default=0.0)
    parser.add_argument("--char-s", type=float, default=0.001)
    parser.add_argument("--journal", help="append each request to this file, a JSON line each")
    args, _ = parser.parse_known_args()  # it stands in for `codespec lsp ...`: that command's flags are ignored

    def make_backend() -> ScriptedBackend:
        time.sleep(args.load_s)  # the model load, on the server's loader thread
        return ScriptedBackend(args.char_s, args.journal)

    configure_logging("info")
    serve(build_server(make_backend))  # as `codespec lsp` serves


if __name__ == "__main__":
    main()
