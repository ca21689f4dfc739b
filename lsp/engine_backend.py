"""`codespec lsp --server URL` against another engine's OpenAI-compatible server
(vLLM, SGLang): the language server builds the FIM prompt with the model's own tokens
and streams `/v1/completions`; the engine generates (and drafts, with codespec's vLLM
proposer or SGLang's corpus: docs/scale.md).

The tokenizer is handed in (loaded by the CLI): this package never imports torch.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

from codespec.integrations.upstream import ServedModel, UpstreamClient
from codespec.lsp.backend import FimRequest, OnText, Progress, detached
from codespec.lsp.http_backend import follow
from codespec.prompts import fim_ids

log = logging.getLogger("codespec.lsp")


class EngineBackend:
    def __init__(self, client: UpstreamClient, tokenizer: Any, served: ServedModel, layout: str) -> None:
        self.client, self.tokenizer, self.served = client, tokenizer, served
        self.layout = layout  # next edits' prompt layout (nextedit/prompt.layout_for)
        self.acceptance: Counter[str] = Counter()

    def prompt_ids(self, request: FimRequest) -> list[int]:
        return fim_ids(self.tokenizer, request.prefix, request.suffix, request.middle,
                       prefix_tokens=request.prefix_tokens, suffix_tokens=request.suffix_tokens, layout=request.layout,
                       extra=request.extra, path=request.path)

    async def complete(self, request: FimRequest, on_text: OnText) -> str:
        body = {"model": self.served.name, "prompt": self.prompt_ids(request), "max_tokens": request.max_tokens,
                "temperature": 0}
        return await follow(lambda stop: (delta.text for delta in self.client.stream(body, stop)), on_text)

    async def next_edit(self, asked: Any) -> list[Any]:
        """The next edit through the engine's `/v1/completions`: the prompt built here, the
        whole rewrite generated there (the re-join rule is codespec's engine's), diffed here."""
        from codespec.nextedit.prompt import planned, proposed

        prompt, fields = await detached(planned, self.layout, self.tokenizer, asked)
        body = {"model": self.served.name, "prompt": prompt.ids, "max_tokens": fields["max_new_tokens"],
                "temperature": 0, "stop": list(fields["stop"])}
        text = await follow(lambda stop: (delta.text for delta in self.client.stream(body, stop)), lambda _: True)
        return proposed(prompt, text)

    async def index_workspace(self, folders: list[str], progress: Progress) -> str:
        progress(f"drafts come from the engine at {self.client.url}", 100)
        return (f"engine {self.served.name} at {self.client.url}; its drafts: CODESPEC_INDEX for vLLM's "
                "codespec proposer, `codespec index export --sglang` for SGLang (docs/scale.md)")

    def update_document(self, path: str, text: str, saved: bool = False) -> None:
        """Open buffers stay here: a remote engine's corpus is loaded at its start."""

    def record_acceptance(self, accepted: bool) -> None:
        self.acceptance["accepted" if accepted else "shown"] += 1
        log.debug("completions: %d accepted of %d shown", self.acceptance["accepted"],
                 self.acceptance["accepted"] + self.acceptance["shown"])

    def close(self) -> None:
        return None
