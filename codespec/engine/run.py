"""One request's life in the engine: its configuration, its run, its result.

A `Run` holds a request's KV slot, proposer session, stop condition and stats; the
engine (engine.py) advances many at once. `GenerationConfig` is what a request asks
for, `Generation` what it gets back.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

from codespec.engine import ahead
from codespec.engine.logprobs import MAX_TOP, Committed, TokenLogprob, with_logprobs
from codespec.engine.stats import GenerationStats
from codespec.engine.stopping import StopCondition
from codespec.errors import RequestError
from codespec.index import Draft
from codespec.policy import controller
from codespec.policy.proposer import NoProposer
from codespec.policy.tree import Accept, VerifyTree

if TYPE_CHECKING:
    from codespec.engine.engine import Engine


@dataclass(frozen=True)
class GenerationConfig:
    max_new_tokens: int = 128
    stop: tuple[str, ...] = ()
    speculate: bool = True
    time_limit_s: float | None = None  # stop ("length") once generation took this long
    # llama.cpp's t_max_predict_ms: the limit counts from the first token, and stops only
    # once a newline was generated (so llama.vim's 250 ms still gets a whole first line)
    time_limit_llama: bool = False
    # llama.cpp's n_indent: after the first line, a line indented less than this (and not
    # blank) ends the generation, cut before its first character
    min_indent: int = 0
    # a text rule (lsp/cut.py's `Landing.end` for a fill-in-the-middle): given the output so
    # far, (where it ends, how far it must reach to know it) or None; a longer output must
    # end at the same place, so that plain and speculative decoding stop at the same token
    end_at: Callable[[str], tuple[int, int] | None] | None = None
    end_ids: frozenset[int] = frozenset()  # more tokens that end it, as EOS does (a FIM's: prompts.fim_end_ids)
    temperature: float = 0.0  # 0: greedy; > 0: lossless speculative sampling
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    # None: no logprobs; k: each committed token's logprob and the k most likely at its place
    logprobs: int | None = None

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise RequestError(f"max_new_tokens must be at least 1, got {self.max_new_tokens}")
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.top_k < 0:
            raise RequestError("temperature must be >= 0, top_p in (0, 1] and top_k >= 0")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_TOP:
            raise RequestError(f"logprobs takes 0 to {MAX_TOP} alternatives, got {self.logprobs}")


@dataclass
class Generation:
    token_ids: list[int]
    text: str
    finish_reason: str  # "stop" (EOS or a stop string) or "length"
    stats: GenerationStats = field(repr=False)
    logprobs: list[TokenLogprob] | None = field(default=None, repr=False)  # one per token id, when asked

    def to_json(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "token_ids": self.token_ids,
            "finish_reason": self.finish_reason,
            "stats": self.stats.to_json(),
        }


class Run:
    """One request: its KV slot, proposer session, stop condition and stats."""

    def __init__(self, engine: Engine, prompt_ids: Sequence[int], config: GenerationConfig) -> None:
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise RequestError("the prompt is empty: give at least one token")
        # Every backend gathers the embedding row of each id unchecked (the row decoder's C,
        # the cuda backend's Triton gather): an id outside the table would read past it.
        vocab = getattr(engine.forward.config, "vocab_size", None)  # None: no table (bench/oracle.py)
        lowest, highest = min(prompt), max(prompt)
        if vocab is not None and (lowest < 0 or highest >= vocab):
            bad = lowest if lowest < 0 else highest
            raise RequestError(f"token id {bad} is outside the model's vocabulary (ids 0 to {vocab - 1})")
        # Drafts never exceed the tokens still allowed, so a pass's rows fit in this room too.
        room = engine.context_limit - len(prompt)
        if room < 1:
            raise RequestError(
                f"the prompt has {len(prompt)} tokens; this server's context holds {engine.context_limit} "
                f"(model: {engine.max_context}, KV slot: {engine.cache.slot_tokens} tokens)"
            )
        self.engine = engine
        self.config = config
        self.prompt = prompt
        self.stop = StopCondition(
            engine.eos_token_ids | config.end_ids,
            min(config.max_new_tokens, room),
            config.stop,
            engine.decode if engine.tokenizer is not None else None,
            config.min_indent,
            config.end_at,
        )
        proposer = engine.proposer if config.speculate else NoProposer()
        self.session = proposer.start(prompt)
        self.plain = isinstance(proposer, NoProposer) or engine.max_draft_tokens == 0  # never drafts
        self.accept: Accept | None = _acceptance(config, engine.forward.device)
        self.logprobs: list[TokenLogprob] | None = None  # one per generated token, when asked
        if config.logprobs is not None:
            self.accept, self.logprobs = with_logprobs(self.accept, config.logprobs), []
        self.acceptance = controller.Acceptance(engine.acceptance)
        self.slot: int | None = None
        self.generated: list[int] = []
        self.finish_reason: str | None = None
        self.prefilled = False
        self.guess: ahead.Guess | None = None  # the next draft, made while the last pass ran
        self.last_kept: tuple[int, ...] = ()  # what the last pass committed
        self.error: BaseException | None = None  # what ended the run, when it failed
        self.stats = GenerationStats(prompt_tokens=len(prompt))
        self._started = time.perf_counter()

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def step(self) -> list[int]:
        """Prefill (first call) or one verify pass; returns the tokens committed."""
        assert not self.done, "step() after the run finished"
        kept = self.engine.step([self])[0]
        if self.error is not None:
            raise self.error
        return kept

    def _guarded(self, work: Any) -> Any:
        try:
            return work()
        except Exception as exc:
            self._fail(exc)
            return []

    def _fail(self, exc: BaseException) -> None:
        self.error = exc
        self.finish_reason = "error"
        self.close()

    def close(self) -> None:
        """Give the KV slot back (its contents stay cached for a later prompt)."""
        if self.slot is not None:
            self.engine.cache.release(self.slot)
            self.slot = None

    def draft_budget(self) -> int:
        # A pass commits at most budget + 1 tokens: never draft past the token limit.
        remaining = self.stop.max_new_tokens - len(self.generated)
        return max(0, min(self.engine.max_draft_tokens, remaining - 1))

    def _prefill(self) -> list[int]:
        engine = self.engine
        if self.slot is None:
            self.slot, reused = engine.cache.acquire(self.prompt)
            self.stats.cached_prompt_tokens = reused
        logits = engine.verifier.prefill(self.slot, self.prompt, start=self.stats.cached_prompt_tokens)
        first = engine.verifier.first(logits, self.accept)
        self.prefilled = True
        kept = self._commit(first.committed[:1], first.logprobs)
        self.stats.ttft_s = time.perf_counter() - self._started
        self._check_time()
        return kept

    def _after_pass(self, draft: Draft, tree: VerifyTree, result: Any) -> list[int]:
        kept = self._commit(result.committed, result.logprobs)
        self.last_kept = tuple(kept)
        self.stats.record_pass(len(draft), len(kept), min(result.accepted, len(kept)), draft.source)
        for depth, node in enumerate((0, *result.path)):  # where an acceptance could happen
            if tree.children(node):
                self.acceptance.observe(draft.match_len + depth, depth < len(result.path), draft.source)
        self._check_time()
        return kept

    def _check_time(self) -> None:
        limit = self.config.time_limit_s
        if not self.done and limit is not None:
            since = self._started + (self.stats.ttft_s if self.config.time_limit_llama else 0.0)
            if time.perf_counter() - since > limit and (not self.config.time_limit_llama
                                                        or "\n" in self.engine.decode(self.generated)):
                self.finish_reason = "length"
        if self.done:
            self.stats.wall_s = time.perf_counter() - self._started
            self.session.finish(self.generated)
            self.close()

    def _commit(self, new: Sequence[int], logprobs: Sequence[TokenLogprob] | None = None) -> list[int]:
        kept, reason = self.stop.admit(self.generated, new)
        self.generated.extend(kept)
        self.session.extend(kept)
        self.stats.generated_tokens = len(self.generated)
        if reason is not None or not kept:
            self.finish_reason = reason or "stop"
        if self.logprobs is None:
            return kept
        assert logprobs is not None, "a run that asked for logprobs accepts through with_logprobs"
        self.logprobs.extend(logprobs[: len(kept)])
        return Committed.of(kept, logprobs[: len(kept)])

    def result(self) -> Generation:
        assert self.done, "result() before the run finished"
        text = self.engine.decode(self.generated)
        logprobs = self.logprobs
        if self.stop.text_end is not None:
            text = text[: self.stop.text_end]
            if logprobs is not None:  # the tokens a stop string cut from the text have none
                logprobs = logprobs[: tokens_in_text(self.engine.decode, self.generated, len(text))]
        return Generation(list(self.generated), text, self.finish_reason or "stop", self.stats, logprobs)


def tokens_in_text(decode: Any, token_ids: Sequence[int], length: int) -> int:
    """How many of `token_ids` it takes to write the first `length` characters of their
    text: the tokens that start before a stop string cut it.

    >>> tokens_in_text(lambda ids: "".join(map(chr, ids)), [104, 105, 33, 33], 3)
    3
    """
    low, high = 0, len(token_ids)
    while low < high:
        middle = (low + high) // 2
        if len(decode(token_ids[:middle])) >= length:
            high = middle
        else:
            low = middle + 1
    return low


def _acceptance(config: GenerationConfig, device: Any) -> Accept | None:
    if config.temperature == 0:
        return None  # greedy: accepted for the whole batch at once
    from codespec.engine.sampling import SamplingParams, new_generator, sample_accept

    params = SamplingParams(config.temperature, config.top_p, config.top_k)
    return functools.partial(sample_accept, params=params, generator=new_generator(device, config.seed))
