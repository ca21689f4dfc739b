"""Peers measured beside codespec, installed for the benchmark only (never vendored).

* Hugging Face transformers' prompt lookup decoding: `model.generate(...,
  prompt_lookup_num_tokens=10)`, batch 1, greedy, on the same model object; and its
  assisted generation (`assistant_model=`, the draft model codespec's draft system uses).
* arctic-inference's suffix tree (SuffixDecoding, Snowflake), as a drafter inside
  codespec's own verifier, so draft quality is compared on equal terms: same model,
  same verify passes, same tree policy. It is built from source (see
  docs/benchmarks.md); when `arctic_inference` is not importable the system is skipped.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import torch

from codespec.index import Draft

HF_PROMPT_LOOKUP_TOKENS = 10  # transformers' own default for prompt_lookup_num_tokens

# SuffixDecoding's defaults in arctic-inference (max_spec_factor, max_spec_offset, min_token_prob)
ARCTIC_SPEC_FACTOR, ARCTIC_SPEC_OFFSET, ARCTIC_MIN_PROB = 1.0, 0.0, 0.1
ARCTIC_MAX_DEPTH = 64


@dataclass
class HFOutcome:
    token_ids: list[int]
    wall_s: float
    ttft_s: float | None


class _FirstTokenClock:
    """A `generate` streamer that only notes when the first new token arrives."""

    def __init__(self) -> None:
        self.calls = 0
        self.first: float | None = None

    def put(self, value: Any) -> None:
        self.calls += 1
        if self.calls == 2 and self.first is None:  # call 1 carries the prompt
            self.first = time.perf_counter()

    def end(self) -> None:
        pass


def hf_prompt_lookup(model: Any, prompt_ids: Sequence[int], max_new_tokens: int,
                     eos_token_ids: Iterable[int]) -> HFOutcome:
    return _hf_generate(model, prompt_ids, max_new_tokens, eos_token_ids,
                        prompt_lookup_num_tokens=HF_PROMPT_LOOKUP_TOKENS)


def hf_assisted(model: Any, assistant: Any, prompt_ids: Sequence[int], max_new_tokens: int,
                eos_token_ids: Iterable[int]) -> HFOutcome:
    """transformers' assisted generation: `assistant` (a smaller model of the same
    tokenizer) drafts, its own heuristic picks how many tokens (as shipped)."""
    return _hf_generate(model, prompt_ids, max_new_tokens, eos_token_ids, assistant_model=assistant)


@torch.inference_mode()
def _hf_generate(model: Any, prompt_ids: Sequence[int], max_new_tokens: int, eos_token_ids: Iterable[int],
                 **speculation: Any) -> HFOutcome:
    eos = sorted(eos_token_ids)
    device = next(model.parameters()).device
    ids = torch.tensor([list(prompt_ids)], device=device)
    clock = _FirstTokenClock()
    start = time.perf_counter()
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                         do_sample=False, eos_token_id=eos, pad_token_id=eos[0], streamer=clock, **speculation)
    wall = time.perf_counter() - start
    new = out[0, ids.shape[1]:].tolist()
    while new and new[-1] in eos:  # codespec's output excludes the EOS token
        new.pop()
    return HFOutcome(new, wall, None if clock.first is None else clock.first - start)


def arctic_available() -> str | None:
    """None when arctic-inference's suffix tree can be imported, else why not."""
    try:
        from arctic_inference.suffix_decoding import SuffixDecodingCache  # noqa: F401
    except ImportError as exc:
        return f"arctic-inference is not installed ({exc}); see docs/benchmarks.md"
    return None


@dataclass
class ArcticProposer:
    """codespec's Proposer interface over arctic-inference's SuffixDecodingCache: a
    per-request tree of the prompt plus a global tree of the repository files and past
    responses; its `speculate` picks the higher-scoring draft of the two."""

    files: dict[str, Sequence[int]]
    max_depth: int = ARCTIC_MAX_DEPTH
    name: str = "arctic"
    _cache: Any = field(init=False, repr=False)
    _next_id: int = field(default=0, init=False, repr=False)

    def __post_init__(self) -> None:
        from arctic_inference.suffix_decoding import SuffixDecodingCache

        self._cache = SuffixDecodingCache(max_tree_depth=self.max_depth, max_cached_requests=-1)
        # repository files enter the global tree the way finished responses do
        for path, tokens in self.files.items():
            req = self._new_id()
            self._cache.start_request(req, [])
            self._cache.add_active_response(req, list(tokens))
            self._cache.stop_request(req)

    def _new_id(self) -> str:
        self._next_id += 1
        return f"r{self._next_id}"

    def start(self, prompt_ids: Sequence[int], prediction: Sequence[int] = ()) -> _ArcticSession:
        """A request's session; a prediction is not drafted from (arctic's tree holds
        the prompt and past outputs only)."""
        req = self._new_id()
        self._cache.start_request(req, list(prompt_ids))
        return _ArcticSession(self._cache, req, list(prompt_ids), self.max_depth)


@dataclass
class _ArcticSession:
    cache: Any
    req: str
    context: list[int]
    max_depth: int
    open: bool = True

    def extend(self, token_ids: Iterable[int]) -> None:
        new = list(token_ids)
        self.context.extend(new)
        if new and self.open:
            self.cache.add_active_response(self.req, new)

    def candidates(self, budget: int) -> list[Draft]:
        # arctic sizes its drafts itself (max_spec_factor x match length): one tree
        found = self.draft(budget, tree=True)
        return [found] if len(found) else []

    def draft(self, budget: int, tree: bool = False) -> Draft:
        if budget <= 0:
            return Draft.empty("arctic")
        got = self.cache.speculate(self.req, self.context[-self.max_depth:], max_spec_tokens=budget,
                                   max_spec_factor=ARCTIC_SPEC_FACTOR, max_spec_offset=ARCTIC_SPEC_OFFSET,
                                   min_token_prob=ARCTIC_MIN_PROB, use_tree_spec=tree)
        if not got.token_ids:
            return Draft.empty("arctic")
        # arctic's parents index its token list with -1 for the context; probabilities
        # become counts (per mille) for codespec's tree ordering and controller
        counts = tuple(max(1, round(p * 1000)) for p in got.probs)
        return Draft(tuple(got.token_ids), tuple(got.parents), counts, int(got.match_len), "arctic")

    def finish(self, generated: Sequence[int]) -> None:
        if self.open:
            self.cache.stop_request(self.req)  # the response joins the global tree
            self.open = False
