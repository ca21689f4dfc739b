"""A remote OpenAI-compatible engine (vLLM, SGLang, another codespec serve) as the
generator behind codespec's front ends: `codespec serve --upstream URL` and
`codespec lsp --server URL`.

Prompts travel as the model's own token ids (`/v1/completions` with `"prompt": [ids]`,
which vLLM, SGLang, llama.cpp and codespec serve all take): codespec builds the FIM
prompt with its tokenizer's FIM and repository tokens, so no engine has to know
codespec's prompt layout, and code that spells `<|fim_middle|>` stays text. Before the
first request the client checks that the engine's tokenizer agrees with ours on a
probe (through the engine's `/tokenize`, when it has one).

Standard library only (urllib on a worker thread): the language server imports this,
and it never imports torch or an HTTP stack of its own.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, Iterator

from codespec.errors import CodespecError

TIMEOUT_S = 120
# Spells the FIM tokens, a repository token, non-ASCII text and code: tokenizers that
# disagree on any id disagree here.
TOKENIZER_PROBE = "<|fim_prefix|>def héllo(x):\n\treturn x  # ok<|fim_suffix|><|fim_middle|><|file_sep|>"


class UpstreamError(CodespecError):
    """The engine could not be reached, refused the request, or serves another tokenizer."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status  # the engine's HTTP status, when it answered


@dataclass(frozen=True)
class ServedModel:
    name: str
    owned_by: str
    max_model_len: int | None  # vLLM and SGLang say; None when the engine does not

    @property
    def is_codespec(self) -> bool:
        return self.owned_by == "codespec"


@dataclass(frozen=True)
class Delta:
    """One streamed piece: text, and at the end the finish reason and token usage."""

    text: str
    finish_reason: str | None = None
    usage: dict[str, int] | None = None


def sse_data(response: Any, stop: threading.Event) -> Iterator[dict[str, Any]]:
    """The JSON payloads of a server-sent-event stream, up to `data: [DONE]` (or the
    end), or until `stop` is set."""
    for raw in response:
        if stop.is_set():
            return
        line = raw.decode("utf-8").strip()
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            return
        yield json.loads(payload)


class UpstreamClient:
    def __init__(self, url: str, api_key: str = "", timeout: float = TIMEOUT_S, peer: str = "the engine") -> None:
        if not url.startswith(("http://", "https://")):
            raise UpstreamError(f"{url}: give the engine's URL such as http://127.0.0.1:8000")
        self.url = url.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout
        self.peer = peer  # what errors call the server

    def open(self, path: str, body: Any | None = None, method: str = "POST") -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method)
        request.add_header("Content-Type", "application/json")
        if self.api_key:
            request.add_header("Authorization", f"Bearer {self.api_key}")
        try:
            return urllib.request.urlopen(request, timeout=self.timeout)
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode("utf-8", "replace")[:300].replace("\n", " ")
            raise UpstreamError(f"{self.url}{path}: HTTP {exc.code}: {detail}", exc.code) from None
        except (urllib.error.URLError, OSError) as exc:
            raise UpstreamError(f"cannot reach {self.peer} at {self.url}: {exc}") from None

    def get_json(self, path: str) -> Any:
        with self.open(path, method="GET") as response:
            return json.load(response)

    def served_model(self) -> ServedModel:
        """The engine's model (the first one `/v1/models` lists)."""
        listing = self.get_json("/v1/models")
        models = listing.get("data") if isinstance(listing, dict) else None
        if not models:
            raise UpstreamError(f"{self.url}/v1/models lists no model: is this an OpenAI-compatible server?")
        first = models[0]
        limit = first.get("max_model_len")
        return ServedModel(str(first.get("id", "")), str(first.get("owned_by", "")),
                           int(limit) if isinstance(limit, int) else None)

    def remote_tokens(self, model: str, text: str) -> list[int] | None:
        """The engine's tokens for `text` (special tokens recognised), or None when it
        has no tokenize route (vLLM: /tokenize; SGLang: /v1/tokenize)."""
        for path in ("/tokenize", "/v1/tokenize"):
            try:
                with self.open(path, {"model": model, "prompt": text, "add_special_tokens": False}) as response:
                    body = json.load(response)
            except UpstreamError as exc:
                if exc.status in (404, 405):
                    continue
                raise
            tokens = body.get("tokens") if isinstance(body, dict) else None
            if isinstance(tokens, list):
                return [int(t) for t in tokens]
        return None

    def check_tokenizer(self, model: str, tokenizer: Any) -> bool:
        """Refuse an engine whose tokenizer gives other ids than ours (the prompts we
        build would mean something else); False when the engine cannot tell."""
        remote = self.remote_tokens(model, TOKENIZER_PROBE)
        if remote is None:
            return False
        local = tokenizer(TOKENIZER_PROBE, add_special_tokens=False)["input_ids"]
        if remote != local:
            raise UpstreamError(f"the engine at {self.url} serves {model!r}, whose tokenizer differs from "
                                "codespec's: give --model the engine's model (a local directory or hub id)")
        return True

    def stream(self, body: dict[str, Any], stop: threading.Event) -> Iterator[Delta]:
        """POST /v1/completions as a stream; ends at `[DONE]` or when `stop` is set
        (closing the connection, which the engine takes as a cancel)."""
        body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        with self.open("/v1/completions", body) as response:
            for chunk in sse_data(response, stop):
                if "error" in chunk:
                    message = chunk["error"].get("message", chunk["error"]) if isinstance(chunk["error"], dict) \
                        else chunk["error"]
                    raise UpstreamError(f"{self.peer} at {self.url} failed: {message}")
                choices = chunk.get("choices") or [{}]
                yield Delta(choices[0].get("text") or "", choices[0].get("finish_reason"), chunk.get("usage"))
