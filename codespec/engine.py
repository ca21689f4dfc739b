"""The engine: prefill, then verify passes until a stop condition, one request at a time.

A `Run` is one request's life; each `step()` is the prefill or one verify pass and
returns the tokens it committed, so a caller can stream them (or, later, a scheduler can
interleave runs). `Engine.generate` drives a run to the end.

    engine = Engine(model, tokenizer, PromptLookupProposer())
    out = engine.generate(tokenizer.encode("def fib(n):"), GenerationConfig(max_new_tokens=64))
    out.text, out.stats.accepted_tokens_per_pass

With `speculate=False` the same run asks for no drafts, so each verify pass is a plain
decode step: that is the reference the lossless tests compare against.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from codespec.errors import RequestError
from codespec.index import SuffixIndex
from codespec.proposer import IndexedProposer, NoProposer, PromptLookupProposer, Proposer
from codespec.settings import Settings
from codespec.stats import GenerationStats
from codespec.stopping import StopCondition
from codespec.sampling import SamplingParams, new_generator, sample_accept
from codespec.verifier import Accept, ChainVerifier, greedy_accept


@dataclass(frozen=True)
class GenerationConfig:
    max_new_tokens: int = 128
    stop: tuple[str, ...] = ()
    speculate: bool = True
    time_limit_s: float | None = None  # stop ("length") once generation took this long
    temperature: float = 0.0  # 0: greedy; > 0: lossless speculative sampling
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise RequestError(f"max_new_tokens must be at least 1, got {self.max_new_tokens}")
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.top_k < 0:
            raise RequestError("temperature must be >= 0, top_p in (0, 1] and top_k >= 0")


@dataclass
class Generation:
    token_ids: list[int]
    text: str
    finish_reason: str  # "stop" (EOS or a stop string) or "length"
    stats: GenerationStats = field(repr=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "token_ids": self.token_ids,
            "finish_reason": self.finish_reason,
            "stats": self.stats.to_json(),
        }


class Engine:
    """Greedy generation with chain speculation over a Hugging Face causal LM."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any = None,
        proposer: Proposer | None = None,
        *,
        max_draft_tokens: int = 16,
        eos_token_ids: Iterable[int] | None = None,
    ) -> None:
        self.verifier = ChainVerifier(model)
        self.tokenizer = tokenizer
        self.proposer = proposer if proposer is not None else PromptLookupProposer()
        self.max_draft_tokens = max_draft_tokens
        self.eos_token_ids = frozenset(eos_token_ids if eos_token_ids is not None else _eos_ids(model, tokenizer))
        self.max_context = int(getattr(model.config, "max_position_embeddings", 0) or 1 << 30)

    @classmethod
    def from_settings(cls, model: Any, tokenizer: Any, settings: Settings, index: SuffixIndex | None = None) -> Engine:
        """An engine whose proposer drafts from the request's context, and from `index`
        (repository, past generations) when one is given."""
        match = dict(min_match_tokens=settings.min_match_tokens, max_match_tokens=settings.max_match_tokens)
        proposer: Proposer = PromptLookupProposer(**match) if index is None else IndexedProposer(index, **match)
        return cls(model, tokenizer, proposer, max_draft_tokens=settings.max_draft_tokens)

    def decode(self, token_ids: Sequence[int]) -> str:
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=True)

    def start(self, prompt_ids: Sequence[int], config: GenerationConfig) -> Run:
        return Run(self, prompt_ids, config)

    def generate(self, prompt_ids: Sequence[int], config: GenerationConfig = GenerationConfig()) -> Generation:
        run = self.start(prompt_ids, config)
        while not run.done:
            run.step()
        return run.result()


class Run:
    """One request: its KV cache, proposer session, stop condition and stats."""

    def __init__(self, engine: Engine, prompt_ids: Sequence[int], config: GenerationConfig) -> None:
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise RequestError("the prompt is empty: give at least one token")
        room = engine.max_context - len(prompt)
        if room < 1:
            raise RequestError(
                f"the prompt has {len(prompt)} tokens; the model's context holds {engine.max_context}"
            )
        self.engine = engine
        self.config = config
        self.prompt = prompt
        self.stop = StopCondition(
            engine.eos_token_ids,
            min(config.max_new_tokens, room),
            config.stop,
            engine.decode if engine.tokenizer is not None else None,
        )
        proposer = engine.proposer if config.speculate else NoProposer()
        self.session = proposer.start(prompt)
        self.cache = engine.verifier.new_cache()
        self.accept = _acceptance(config, engine.verifier.device)
        self.generated: list[int] = []
        self.finish_reason: str | None = None
        self._prefilled = False
        self.stats = GenerationStats(prompt_tokens=len(prompt))
        self._started = time.perf_counter()

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def step(self) -> list[int]:
        """Prefill (first call) or one verify pass; returns the tokens committed."""
        assert not self.done, "step() after the run finished"
        verifier = self.engine.verifier
        if not self._prefilled:
            self._prefilled = True
            kept = self._commit([verifier.prefill(self.cache, self.prompt, self.accept)])
            self.stats.ttft_s = time.perf_counter() - self._started
        else:
            draft = self.session.draft(self._draft_budget())
            result = verifier.verify(self.cache, self.generated[-1], draft.token_ids, self.accept)
            kept = self._commit(result.committed)
            self.stats.record_pass(len(draft), len(kept), min(result.accepted, len(kept)), draft.source)
        limit = self.config.time_limit_s
        if not self.done and limit is not None and time.perf_counter() - self._started > limit:
            self.finish_reason = "length"
        if self.done:
            self.stats.wall_s = time.perf_counter() - self._started
            self.session.finish(self.generated)
        return kept

    def _draft_budget(self) -> int:
        # A pass commits at most budget + 1 tokens: never draft past the token limit.
        remaining = self.stop.max_new_tokens - len(self.generated)
        return max(0, min(self.engine.max_draft_tokens, remaining - 1))

    def _commit(self, new: Sequence[int]) -> list[int]:
        kept, reason = self.stop.admit(self.generated, new)
        self.generated.extend(kept)
        self.session.extend(kept)
        self.stats.generated_tokens = len(self.generated)
        if reason is not None or not kept:
            self.finish_reason = reason or "stop"
        return kept

    def result(self) -> Generation:
        assert self.done, "result() before the run finished"
        text = self.engine.decode(self.generated)
        if self.stop.text_end is not None:
            text = text[: self.stop.text_end]
        return Generation(list(self.generated), text, self.finish_reason or "stop", self.stats)


def _acceptance(config: GenerationConfig, device: Any) -> Accept:
    if config.temperature == 0:
        return greedy_accept
    params = SamplingParams(config.temperature, config.top_p, config.top_k)
    return functools.partial(sample_accept, params=params, generator=new_generator(device, config.seed))


def _eos_ids(model: Any, tokenizer: Any) -> set[int]:
    ids: set[int] = set()
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(configured, int):
        ids.add(configured)
    elif configured:
        ids.update(int(t) for t in configured)
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return ids
