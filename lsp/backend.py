"""What the language server needs from a model: the `CompletionBackend` protocol.

    request = FimRequest(prefix, suffix, max_tokens=128, path="pkg/mod.py")
    text = await backend.complete(request, on_text=check)   # on_text(text) -> False stops

Four implementations: `InProcessBackend` (inprocess_backend.py: the engine in this
process, the default; the CLI loads it), `HttpBackend` (http_backend.py: a running
`codespec serve`), `EngineBackend` (engine_backend.py: another engine's OpenAI-compatible
server) and `RemoteBackend` (remote_backend.py: whichever of the last two a `--server`
URL turns out to be).
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Protocol, TypeVar

from codespec.lsp.options import LspOptions
from codespec.prompts import ExtraFile

T = TypeVar("T")

OnText = Callable[[str], bool]  # the completion so far; return False to stop generating
Progress = Callable[[str, int], None]  # message, percentage


@dataclass(frozen=True)
class FimRequest:
    prefix: str  # the file before the cursor (already cut to the token budget by chars)
    suffix: str  # the file after the cursor
    max_tokens: int
    path: str = ""  # the file's path in the workspace, for repository context
    prefix_tokens: int = LspOptions.model_fields["prefix_tokens"].default  # the editor's defaults
    suffix_tokens: int = LspOptions.model_fields["suffix_tokens"].default
    # the typed part of the cursor's line, after the FIM middle token (llama.cpp's /infill
    # `prompt`): typing along a line then changes only the prompt's last tokens, and the
    # prefix before the line and the suffix stay cached
    middle: str = ""
    layout: str = "psm"  # prompts.FIM_LAYOUTS: the order of prefix and suffix in the prompt
    extra: tuple[ExtraFile, ...] = ()  # other files' code, before the file's window (lsp/context.py)


class CompletionBackend(Protocol):
    async def complete(self, request: FimRequest, on_text: OnText) -> str:
        """The completion text (stopped early when `on_text` returned False). Cancelling
        the awaiting task cancels the generation."""

    async def next_edit(self, asked: Any) -> list[Any]:
        """The edits (nextedit/rewrite.py's `Edit`: offsets into the document) the model
        predicts after the recent ones, for a nextedit/prompt.py `NextEditRequest`."""

    async def index_workspace(self, folders: list[str], progress: Progress) -> str:
        """Index the folders (repository context); returns a one-line summary."""

    def update_document(self, path: str, text: str, saved: bool = False) -> None:
        """An open buffer changed (or was saved): keep the index's copy current."""

    def record_acceptance(self, accepted: bool) -> None:
        """Telemetry: a completion was shown (False) or accepted (True)."""

    # Optional: `prefill_ahead(key, request | None)`, the prompt of a request likely to
    # come soon, to prefill in idle time (lsp/ahead.py; the in-process backend has it).

    def close(self) -> Awaitable[None] | None:
        """Release the model or the connection."""


def settle(future: asyncio.Future[Any], value: Any) -> None:
    """Resolve `future` with `value` unless it already is (or was cancelled): for results
    that race, handed to the event loop with `call_soon_threadsafe`."""
    if not future.done():
        future.set_result(value)


async def detached(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`fn(*args, **kwargs)` on a daemon thread of its own. Not `asyncio.to_thread`: the
    event loop's executor threads are joined when the loop ends, so a model load or an
    index build in one kept the language server alive for minutes after the editor closed
    its pipe."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def run() -> None:
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task
            loop.call_soon_threadsafe(fail, future, exc)
        else:
            loop.call_soon_threadsafe(settle, future, result)

    threading.Thread(target=run, name=f"codespec-{getattr(fn, '__name__', 'work')}", daemon=True).start()
    return await future


def fail(future: asyncio.Future[Any], exc: BaseException) -> None:
    """Fail `future` with `exc` unless it is already done (see `settle`)."""
    if not future.done():
        future.set_exception(exc)
