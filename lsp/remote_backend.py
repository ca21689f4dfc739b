"""`codespec lsp --server URL`: which client fits the URL is known only once it answers.

`codespec serve` gets `HttpBackend` (its `/infill` adds repository context); vLLM,
SGLang or any other OpenAI-compatible engine gets `EngineBackend` (FIM prompts built
here). Until the URL answers, every call asks again: an editor started before its
server shows "cannot reach" and recovers when the server comes up.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from codespec.lsp.backend import CompletionBackend, FimRequest, OnText, Progress, detached


class RemoteBackend:
    def __init__(self, resolve: Callable[[], CompletionBackend]) -> None:
        self._resolve = resolve
        self._backend: CompletionBackend | None = None
        self._lock = threading.Lock()

    def resolved(self) -> CompletionBackend:
        with self._lock:
            if self._backend is None:
                self._backend = self._resolve()  # raises while the URL does not answer
            return self._backend

    async def complete(self, request: FimRequest, on_text: OnText) -> str:
        backend = await detached(self.resolved)
        return await backend.complete(request, on_text)

    async def next_edit(self, asked: Any) -> list[Any]:
        backend = await detached(self.resolved)
        return await backend.next_edit(asked)

    async def index_workspace(self, folders: list[str], progress: Progress) -> str:
        backend = await detached(self.resolved)
        return await backend.index_workspace(folders, progress)

    def update_document(self, path: str, text: str, saved: bool = False) -> None:
        if self._backend is not None:
            self._backend.update_document(path, text, saved)

    def record_acceptance(self, accepted: bool) -> None:
        if self._backend is not None:
            self._backend.record_acceptance(accepted)

    def prefill_ahead(self, key: str, request: FimRequest | None) -> None:
        prefill = getattr(self._backend, "prefill_ahead", None)
        if callable(prefill):
            prefill(key, request)

    def close(self) -> Any:
        return None if self._backend is None else self._backend.close()
