"""The language server's in-process backend: the engine, the scheduler and the suffix
index in the `codespec lsp` process (the default; `--server URL` uses a running
`codespec serve` instead). Where the torch-free backend serves the model
(forward/select.py) nothing here imports torch; `lsp/` never does.

Completions are fill-in-the-middle prompts with the model's own FIM tokens: the last
`prefix_tokens` of the file before the cursor and the first `suffix_tokens` after it.
Repository context comes from the suffix index, whose matches are the retrieval: the
workspace is indexed at start-up, open buffers replace their files' copies as they
change, so drafts follow what the user is editing.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import Counter
from pathlib import Path
from typing import Any

from codespec.engine import GenerationConfig
from codespec.index import SuffixIndex
from codespec.lsp.backend import FimRequest, OnText, Progress
from codespec.prompts import encode_texts, fim_ids
from codespec.settings import Settings

log = logging.getLogger("codespec.lsp")


class InProcessBackend:
    def __init__(self, settings: Settings) -> None:
        from codespec.server.backend import start_scheduler

        self.settings = settings
        self.index = SuffixIndex()
        self.scheduler, _ = start_scheduler(settings, self.index)  # the backend select.py picks
        self.engine = self.scheduler.engine
        self.tokenizer = self.engine.tokenizer
        self.acceptance: Counter[str] = Counter()
        self.root: Path | None = None  # the indexed workspace folder

    def prompt_ids(self, request: FimRequest) -> list[int]:
        return fim_ids(self.tokenizer, request.prefix, request.suffix, prefix_tokens=request.prefix_tokens,
                       suffix_tokens=request.suffix_tokens)

    async def complete(self, request: FimRequest, on_text: OnText) -> str:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[str] = loop.create_future()
        tokens: list[int] = []
        state = {"text": ""}

        def on_tokens(new: list[int]) -> None:  # the scheduler's thread
            tokens.extend(new)
            state["text"] = self.engine.decode(tokens)
            if not on_text(state["text"]):
                ticket.cancel()
                loop.call_soon_threadsafe(_resolve, done, state["text"])

        def on_done(outcome: Any) -> None:
            if isinstance(outcome, BaseException):
                loop.call_soon_threadsafe(_fail, done, outcome)
            else:
                loop.call_soon_threadsafe(_resolve, done, outcome.text)

        config = GenerationConfig(max_new_tokens=request.max_tokens)
        ticket = self.scheduler.submit(self.prompt_ids(request), config, on_tokens=on_tokens, on_done=on_done)
        try:
            return await done
        finally:
            ticket.cancel()  # superseded or cancelled: the scheduler drops it at the next step

    async def index_workspace(self, folders: list[str], progress: Progress) -> str:
        from codespec.indexing import build_repository_index, default_index_path, tokenizer_fingerprint

        fingerprint = tokenizer_fingerprint(self.tokenizer)
        summaries = []
        for folder in folders:
            root = Path(folder)
            out = default_index_path(self.settings.cache_dir, root)

            def on_file(done: int, total: int, name: str = root.name) -> None:
                progress(f"{name}: {done}/{total} files", int(100 * done / max(total, 1)))

            report = await asyncio.to_thread(build_repository_index, root, self.tokenizer, out, progress=False,
                                             on_file=on_file)
            self.index.static = SuffixIndex.load(out, tokenizer=fingerprint).static
            self.root = root
            summaries.append(f"{root.name}: {report.files} files, {report.tokens} tokens")
            break  # one static index: the first folder (others still get open-buffer drafts)
        return "; ".join(summaries) or "no workspace folder"

    def update_document(self, path: str, text: str, saved: bool = False) -> None:
        """The buffer replaces its file in the index at once (dynamic side); a save also
        rebuilds the static index in the background, incrementally (only changed files
        are tokenized again)."""

        def update() -> None:
            self.index.update_file(path, encode_texts(self.tokenizer, [text])[0])

        threading.Thread(target=update, daemon=True).start()  # tokenizing a big file takes a while
        if saved and self.root is not None:
            self._rebuild(self.root)

    def _rebuild(self, root: Path) -> None:
        from codespec.indexing import build_repository_index, default_index_path, tokenizer_fingerprint

        out = default_index_path(self.settings.cache_dir, root)

        def build() -> Any:
            build_repository_index(root, self.tokenizer, out, progress=False)
            return SuffixIndex.load(out, tokenizer=tokenizer_fingerprint(self.tokenizer)).static

        try:
            self.index.rebuild_in_background(build)
        except RuntimeError:
            pass  # one is running; the open buffer's copy keeps drafts current meanwhile

    def record_acceptance(self, accepted: bool) -> None:
        self.acceptance["accepted" if accepted else "shown"] += 1
        log.info("completions: %d accepted of %d shown", self.acceptance["accepted"],
                 self.acceptance["accepted"] + self.acceptance["shown"])

    def close(self) -> None:
        self.scheduler.close()


def _resolve(future: asyncio.Future[str], value: str) -> None:
    if not future.done():
        future.set_result(value)


def _fail(future: asyncio.Future[str], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)
