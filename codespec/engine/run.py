"""One request's life in the engine: its configuration, its run, its result.

A `Run` holds a request's KV slot, proposer session, stop condition and stats; the
engine (engine.py) builds it, checks its prompt and advances many at once. `GenerationConfig` is what a request asks
for, `Generation` what it gets back.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from codespec.engine import ahead
from codespec.verify.logprobs import MAX_TOP, Committed, TokenLogprob, with_logprobs
from codespec.engine.stats import GenerationStats
from codespec.engine.stopping import StopCondition
from codespec.errors import RequestError
from codespec.index import Draft
from codespec.policy import controller
from codespec.verify.grammar import Constraint, constrained, prune
from codespec.verify.tree import Accept, VerifyTree


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
    # a text rule (landing/cut.py's `Landing.end` for a fill-in-the-middle): given the output so
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
    # the output the client expects (OpenAI's Predicted Outputs): one more draft source,
    # never a change to the output (index/prediction.py)
    prediction: tuple[int, ...] = ()
    # what the output must follow (structured/grammar.py's Grammar: its `start()` gives a
    # run its verify/grammar.py Constraint); None: free text
    grammar: Any = None

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
    """One request's state: its prompt, KV slot, proposer session, stop condition, what it
    committed and its stats. The engine (engine.py) validates it, drives it and reads it;
    a run calls nothing of the engine's. `release` gives a KV slot back to the cache."""

    def __init__(self, prompt: list[int], config: GenerationConfig, *, stop: StopCondition, session: Any,
                 plain: bool, accept: Accept | None, acceptance: controller.Acceptance, max_draft: int,
                 decode: Callable[[Sequence[int]], str], release: Callable[[int], None],
                 constraint: Constraint | None = None) -> None:
        self.config = config
        self.constraint = constraint  # the grammar's state: drafts are pruned to it
        self.prompt = prompt
        self.stop = stop
        self.session = session
        self.plain = plain  # never drafts
        self.accept = accept
        self.logprobs: list[TokenLogprob] | None = None  # one per generated token, when asked
        if config.logprobs is not None:
            self.accept, self.logprobs = with_logprobs(self.accept, config.logprobs), []
        self.acceptance = acceptance
        self.max_draft = max_draft
        self.decode = decode
        self._release = release
        self.slot: int | None = None
        self.generated: list[int] = []
        self.finish_reason: str | None = None
        self.prefilled = False
        self.guess: ahead.Guess | None = None  # the next draft, made while the last pass ran
        self.last_kept: tuple[int, ...] = ()  # what the last pass committed
        self.error: BaseException | None = None  # what ended the run, when it failed
        self.on_close: list[Callable[[], None]] = []  # what else it holds (a draft model's slot)
        self.stats = GenerationStats(prompt_tokens=len(prompt))
        self._started = time.perf_counter()

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def guarded(self, work: Callable[[], Any]) -> Any:
        """`work()`, or [] with the run failed where it raises: one run's failure is its own."""
        try:
            return work()
        except Exception as exc:
            self.fail(exc)
            return []

    def fail(self, exc: BaseException) -> None:
        self.error = exc
        self.finish_reason = "error"
        self.close()

    def close(self) -> None:
        """Give the KV slots back (their contents stay cached for a later prompt)."""
        if self.slot is not None:
            self._release(self.slot)
            self.slot = None
        while self.on_close:
            self.on_close.pop()()

    def allowed(self, draft: Draft) -> Draft:
        """The draft without the branches the request's grammar forbids."""
        return draft if self.constraint is None else prune(draft, self.constraint)

    def allowed_all(self, drafts: list[Draft]) -> list[Draft]:
        """Each draft as `allowed` leaves it, the emptied ones dropped."""
        if self.constraint is None:
            return drafts
        return [d for d in map(self.allowed, drafts) if len(d)]

    def draft_budget(self) -> int:
        # A pass commits at most budget + 1 tokens: never draft past the token limit.
        remaining = self.stop.max_new_tokens - len(self.generated)
        return max(0, min(self.max_draft, remaining - 1))

    def prefilled_with(self, first: Any) -> list[int]:
        """The prefill's first token committed (`first`: the verifier's result)."""
        self.prefilled = True
        kept = self._commit(first.committed[:1], first.logprobs)
        self.stats.ttft_s = time.perf_counter() - self._started
        self._check_time()
        return kept

    def after_pass(self, draft: Draft, tree: VerifyTree, result: Any) -> list[int]:
        """A verify pass's result committed, its drafts' acceptance recorded."""
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
                                                        or "\n" in self.decode(self.generated)):
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
        text = self.decode(self.generated)
        logprobs = self.logprobs
        if self.stop.text_end is not None:
            text = text[: self.stop.text_end]
            if logprobs is not None:  # the tokens a stop string cut from the text have none
                logprobs = logprobs[: tokens_in_text(self.decode, self.generated, len(text))]
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


def acceptance_of(config: GenerationConfig, device: Any, constraint: Constraint | None = None) -> Accept | None:
    """How a run's draft tokens are accepted: None (greedy, for the whole batch at once),
    its sampling rule on `device`, or either under its grammar's `constraint`."""
    if config.temperature == 0:
        return None if constraint is None else constrained(constraint)
    from codespec.verify.sampling import SamplingParams, new_generator, sample_accept

    params = SamplingParams(config.temperature, config.top_p, config.top_k)
    generator = new_generator(device, config.seed)
    if constraint is not None:
        return constrained(constraint, params, generator)
    return functools.partial(sample_accept, params=params, generator=generator)
