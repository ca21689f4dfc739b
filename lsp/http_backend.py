"""`codespec lsp --server URL`: the language server as a thin client of `codespec serve`.

Completions go to the server's `/infill` (llama.cpp's shape: `input_prefix`,
`input_suffix`, `n_predict`, plus codespec's `fim_layout`) as a stream, open buffers to
`/v1/index/documents` and prompts to prefill in idle time to `/v1/lsp/prefill` (each
through one worker that sends a key's latest value: never a thread per change), and
acceptance telemetry to `/v1/lsp/acceptance`. Only the standard library: the
language server never imports torch, or an HTTP stack of its own.
"""

from __future__ import annotations

import contextlib
import json
import threading
from typing import Any, Callable, Iterator

from codespec.integrations.upstream import UpstreamClient, UpstreamError, sse_data
from codespec.lsp.window import HTTP_CHARS_PER_TOKEN, prefix_window, suffix_window
from codespec.lsp.backend import FimRequest, OnText, Progress, detached
from codespec.lsp.feed import BufferFeed

TIMEOUT_S = 120
BackendError = UpstreamError  # the server could not be reached or refused the request (one line)


async def follow(pieces: Callable[[threading.Event], Iterator[str]], on_text: OnText) -> str:
    """The text a streamed completion has grown to, read on a worker thread until the
    stream ends or `on_text` says stop. Cancelling the awaiting task sets the stream's
    stop event: the read ends and the server sees the disconnect."""
    stop = threading.Event()

    def run() -> str:
        text = ""
        with contextlib.closing(pieces(stop)) as stream:
            for piece in stream:
                text += piece
                if not on_text(text):
                    break
        return text

    try:
        return await detached(run)
    finally:
        stop.set()


class HttpBackend:
    def __init__(self, url: str, api_key: str = "") -> None:
        self.client = UpstreamClient(url, api_key, TIMEOUT_S, peer="codespec serve")
        self.url = self.client.url
        self.documents = BufferFeed(self._send_document)
        self.ahead = BufferFeed(self._send_prefill, settle_s=0.0)

    def _request(self, path: str, body: Any | None = None, method: str = "POST") -> Any:
        return self.client.open(path, body, method)

    @staticmethod
    def infill_body(request: FimRequest) -> dict[str, Any]:
        # /infill does not cut by tokens: the windows are cut here, by characters, on their grids
        prefix = prefix_window(request.prefix, request.prefix_tokens * HTTP_CHARS_PER_TOKEN)
        suffix = suffix_window(request.suffix, request.suffix_tokens * HTTP_CHARS_PER_TOKEN)
        return {"input_prefix": prefix, "input_suffix": suffix, "prompt": request.middle,
                "input_extra": [{"filename": c.filename, "text": c.text} for c in request.extra],
                "fim_layout": request.layout, "anchor_prefix": False}

    async def complete(self, request: FimRequest, on_text: OnText) -> str:
        body = {**self.infill_body(request), "n_predict": request.max_tokens, "stream": True}

        def pieces(stop: threading.Event) -> Iterator[str]:
            with self._request("/infill", body) as response:
                for chunk in sse_data(response, stop):
                    yield chunk.get("content", "")
                    if chunk.get("stop"):
                        return

        return await follow(pieces, on_text)

    async def next_edit(self, asked: Any) -> list[Any]:
        """`codespec serve`'s POST /v1/next_edit for the request: the edits it predicts."""
        from codespec.nextedit.rewrite import Edit

        body = {"path": asked.path, "text": asked.document, "cursor": asked.cursor,
                "recent_edits": [{"path": e.uri, "start_line": e.start, "before": e.before, "after": e.after}
                                 for e in asked.history]}

        def send() -> list[Any]:
            with self._request("/v1/next_edit", body) as response:
                answer = json.load(response)
            return [Edit(e["start"], e["end"], e["text"]) for e in answer["edits"]]

        return await detached(send)

    async def index_workspace(self, folders: list[str], progress: Progress) -> str:
        progress("the server indexes its own repository (codespec serve --repo)", 100)
        with self._request("/v1/index/stats", method="GET") as response:
            stats = json.load(response)
        static = stats.get("static") or {}
        return f"server index: {static.get('files', 0)} files, {static.get('tokens', 0)} tokens"

    def update_document(self, path: str, text: str, saved: bool = False) -> None:
        self.documents.put(path, text)

    def _send_document(self, path: str, text: str) -> None:
        try:
            self._request("/v1/index/documents", {"key": f"file:{path}", "text": text}).close()
        except BackendError:
            pass  # the index copy is a hint; completions still work

    def prefill_ahead(self, key: str, request: FimRequest | None) -> None:
        """The prompt of a request likely to come soon (lsp/ahead.py), for the server to
        prefill in idle time; None forgets `key`'s."""
        self.ahead.put(key, request)

    def _send_prefill(self, key: str, request: FimRequest | None) -> None:
        body = {"key": key, **(self.infill_body(request) if request is not None else {"forget": True})}
        try:
            self._request("/v1/lsp/prefill", body).close()
        except BackendError:
            pass  # a hint: an older server without the route, or a busy one

    def record_acceptance(self, accepted: bool) -> None:
        def send() -> None:
            try:
                self._request("/v1/lsp/acceptance", {"accepted": accepted}).close()
            except BackendError:
                pass

        threading.Thread(target=send, daemon=True).start()

    def close(self) -> None:
        self.documents.close()
        self.ahead.close()
