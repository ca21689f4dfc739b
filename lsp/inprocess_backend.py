"""The language server's in-process backend: the engine, the scheduler and the suffix
index in the `codespec lsp` process (the default; `--server URL` uses a running
`codespec serve` instead). Where the torch-free backend serves the model
(forward/select.py) nothing here imports torch; the CLI imports this module alone of
the backends that load a model.

Completions are fill-in-the-middle prompts with the model's own FIM tokens: the last
`prefix_tokens` of the file before the cursor and the first `suffix_tokens` after it.
Repository context comes from the suffix index, whose matches are the retrieval: the
workspace is indexed at start-up, open buffers replace their files' copies as they
change, so drafts follow what the user is editing.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from pathlib import Path
from typing import Any

from codespec.engine.run import GenerationConfig
from codespec.engine.textstream import IncrementalText
from codespec.index import SuffixIndex
from codespec.lsp.backend import FimRequest, OnText, Progress, detached, fail, settle
from codespec.lsp.feed import BufferFeed
from codespec.prompts import encode_texts, fim_end_ids, fim_ids
from codespec.settings import Settings

log = logging.getLogger("codespec.lsp")


class InProcessBackend:
    def __init__(self, settings: Settings) -> None:
        from codespec.engine.scheduler import start_scheduler

        self.settings = settings
        self.index = SuffixIndex()
        self.scheduler, _ = start_scheduler(settings, self.index)  # the backend select.py picks
        self.engine = self.scheduler.engine
        self.tokenizer = self.engine.tokenizer
        self.acceptance: Counter[str] = Counter()
        self.prompts = PromptCacheStats()
        self.root: Path | None = None  # the indexed workspace folder
        self.buffers = BufferFeed(lambda path, text: self.index.update_file(path, encode_texts(self.tokenizer,
                                                                                                [text])[0]))
        # prompts to prefill in idle time (lsp/ahead.py), tokenized off the event loop: a
        # tokenizer call can wait on the lock behind a 5 MB buffer's (~1 s)
        self.ahead = BufferFeed(self._hand_ahead, settle_s=0.0)

    def prompt_ids(self, request: FimRequest) -> list[int]:
        return fim_ids(self.tokenizer, request.prefix, request.suffix, request.middle,
                       prefix_tokens=request.prefix_tokens, suffix_tokens=request.suffix_tokens, layout=request.layout,
                       extra=request.extra, path=request.path)

    def prefill_ahead(self, key: str, request: FimRequest | None) -> None:
        """The prompt of a request likely to come soon (None: forget `key`'s): the
        scheduler prefills its whole passes while no request runs."""
        self.ahead.put(key, request)

    def _hand_ahead(self, key: str, request: FimRequest | None) -> None:
        self.scheduler.prefill_ahead(key, None if request is None else self.prompt_ids(request))

    async def complete(self, request: FimRequest, on_text: OnText) -> str:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[str] = loop.create_future()
        text = IncrementalText(self.engine.decode)  # the scheduler thread's: new tokens alone decoded
        seen = [""]  # the completion so far, on the event loop

        def on_tokens(new: list[int]) -> None:  # the scheduler's thread: no editor logic here
            if not text.tokens and ticket.run is not None:  # prefilled: how much of the prompt the cache held
                self.prompts.add(ticket.run.stats.prompt_tokens, ticket.run.stats.cached_prompt_tokens)
            piece = text.push(new)
            if piece:
                loop.call_soon_threadsafe(took, piece)

        def took(piece: str) -> None:  # the event loop: the language server's cut judges the text
            if done.done():
                return
            seen[0] += piece
            if not on_text(seen[0]):
                ticket.cancel()
                settle(done, seen[0])

        def on_done(outcome: Any) -> None:
            if isinstance(outcome, BaseException):
                loop.call_soon_threadsafe(fail, done, outcome)
            else:
                if not text.tokens:  # finished without a token: counted here
                    self.prompts.add(outcome.stats.prompt_tokens, outcome.stats.cached_prompt_tokens)
                loop.call_soon_threadsafe(settle, done, outcome.text)

        # a FIM token from the model ends its completion
        config = GenerationConfig(max_new_tokens=request.max_tokens, end_ids=fim_end_ids(self.tokenizer))
        ticket = self.scheduler.submit(self.prompt_ids(request), config, on_tokens=on_tokens, on_done=on_done)
        try:
            return await done
        finally:
            ticket.cancel()  # superseded or cancelled: the scheduler drops it at the next step

    async def next_edit(self, asked: Any) -> list[Any]:
        """The edits the model predicts after the recent ones (nextedit/): its rewrite of
        the window around the cursor, diffed against it."""
        from codespec.nextedit.prompt import layout_for, planned, proposed

        loop = asyncio.get_running_loop()
        prompt, fields = await detached(planned, layout_for(self.settings.next_edit_layout, self.settings.model),
                                         self.tokenizer, asked)
        done: asyncio.Future[Any] = loop.create_future()

        def on_done(outcome: Any) -> None:
            loop.call_soon_threadsafe(fail if isinstance(outcome, BaseException) else settle, done, outcome)

        ticket = self.scheduler.submit(prompt.ids, GenerationConfig(**fields),
                                       on_tokens=lambda new: None, on_done=on_done)
        try:
            return proposed(prompt, (await done).text)
        finally:
            ticket.cancel()

    async def index_workspace(self, folders: list[str], progress: Progress) -> str:
        from codespec.indexing import build_static_index

        summaries = []
        for folder in folders:
            root = Path(folder)

            def on_file(done: int, total: int, name: str = root.name) -> None:
                progress(f"{name}: {done}/{total} files", int(100 * done / max(total, 1)))

            report, self.index.static = await detached(build_static_index, root, self.tokenizer,
                                                       self.settings.cache_dir, on_file=on_file,
                                                       max_total_bytes=self.settings.index_max_mb << 20)
            self.root = root
            capped = f" (stopped at the {self.settings.index_max_mb} MiB cap)" if report.skipped.over_cap else ""
            summaries.append(f"{root.name}: {report.files} files, {report.tokens} tokens{capped}")
            break  # one static index: the first folder (others still get open-buffer drafts)
        return "; ".join(summaries) or "no workspace folder"

    def update_document(self, path: str, text: str, saved: bool = False) -> None:
        """The buffer replaces its file in the index soon (dynamic side, through one
        worker that keeps only each file's latest text); a save also rebuilds the static
        index in the background, incrementally (only changed files are tokenized again)."""
        self.buffers.put(path, text)
        if saved and self.root is not None:
            self._rebuild(self.root)

    def _rebuild(self, root: Path) -> None:
        from codespec.indexing import build_static_index

        def build() -> Any:
            return build_static_index(root, self.tokenizer, self.settings.cache_dir,
                                      max_total_bytes=self.settings.index_max_mb << 20)[1]

        try:
            self.index.rebuild_in_background(build)
        except RuntimeError:
            pass  # one is running; the open buffer's copy keeps drafts current meanwhile

    def record_acceptance(self, accepted: bool) -> None:
        self.acceptance["accepted" if accepted else "shown"] += 1
        log.debug("completions: %d accepted of %d shown", self.acceptance["accepted"],
                 self.acceptance["accepted"] + self.acceptance["shown"])

    def stats(self) -> dict[str, Any]:
        return {"prompt_cache": self.prompts.to_json(), "acceptance": dict(self.acceptance),
                "buffers_pending": self.buffers.pending,
                "prefilled_ahead": {"tokens": self.scheduler.ahead_tokens, "preempted": self.scheduler.ahead_preempted}}

    def close(self) -> None:
        self.buffers.close()
        self.ahead.close()
        self.scheduler.close()


class PromptCacheStats:
    """How much of each completion's prompt the KV prefix cache held (the
    window stays put while the person types, so this should stay high)."""

    def __init__(self) -> None:
        self.requests = self.prompt_tokens = self.cached_tokens = 0
        self.last: tuple[int, int] = (0, 0)

    def add(self, prompt_tokens: int, cached_tokens: int) -> None:
        self.requests += 1
        self.prompt_tokens += prompt_tokens
        self.cached_tokens += cached_tokens
        self.last = (prompt_tokens, cached_tokens)

    def to_json(self) -> dict[str, Any]:
        return {"requests": self.requests, "prompt_tokens": self.prompt_tokens, "cached_tokens": self.cached_tokens,
                "hit_rate": round(self.cached_tokens / self.prompt_tokens, 4) if self.prompt_tokens else None,
                "last": {"prompt_tokens": self.last[0], "cached_tokens": self.last[1]}}
