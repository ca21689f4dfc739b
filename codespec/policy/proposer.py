"""Proposers: the policy that turns index matches into drafts for one request.

The engine opens one session per request (`Proposer.start(prompt_ids)`), feeds it every
committed token (`extend`) and asks for a draft before each verify pass (`draft(budget)`).
The index answers "what followed the longest match"; the proposer decides how much of
that to propose: nothing for a match shorter than `min_match_tokens`, otherwise k tokens
for a k-token match, capped by the budget the engine grants.

>>> p = PromptLookupProposer(min_match_tokens=2)
>>> s = p.start([10, 11, 12, 13, 10, 11])
>>> s.draft(budget=8).token_ids     # [10, 11] matched: 2 tokens proposed
(12, 13)
>>> s.extend([12]); s.draft(budget=8).token_ids   # [10, 11, 12] matched: up to 3
(13, 10, 11)
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Callable, Iterable, Protocol, Sequence

from codespec.index import ContextMatcher, Draft, SuffixIndex
from codespec.index.anchor import ANCHOR_MIN_MATCH, CopyAnchor
from codespec.index.anchor import SOURCE as ANCHOR
from codespec.index.prediction import PredictionMatcher


class ProposerSession(Protocol):
    def extend(self, token_ids: Iterable[int]) -> None:
        """Record committed tokens (the request's output) in the session's context."""

    def draft(self, budget: int, tree: bool = False) -> Draft:
        """A draft of at most `budget` tokens continuing the context (maybe empty): a
        chain, or with `tree` a token tree of at most `budget` nodes, at most k deep for
        a k-token match."""

    def candidates(self, budget: int) -> list[Draft]:
        """Every draft the session's sources offer now, each a tree of at most `budget`
        nodes and up to `budget` deep, for a caller that prices every node by its
        calibrated acceptance and keeps the best (the goodput controller)."""

    def finish(self, generated: Sequence[int]) -> None:
        """The request ended with output `generated` (a source for later requests)."""


class Proposer(Protocol):
    name: str

    def start(self, prompt_ids: Sequence[int], prediction: Sequence[int] = ()) -> ProposerSession:
        """Open a session for one request whose context starts as `prompt_ids`;
        `prediction`: the output the request's client expects (one more source)."""


@dataclass(frozen=True)
class PromptLookupProposer:
    """Drafts from the longest suffix match within the request's own prompt and output."""

    min_match_tokens: int = 2
    max_match_tokens: int = 64
    name: str = "prompt"

    def start(self, prompt_ids: Sequence[int], prediction: Sequence[int] = ()) -> _LookupSession:
        return _LookupSession(ContextMatcher(prompt_ids, max_match=self.max_match_tokens), self.min_match_tokens,
                              prediction=_predicted(prediction))


@dataclass(frozen=True)
class IndexedProposer:
    """Drafts from the longest match among the request's own context and a SuffixIndex
    (repository snapshot, past generations, open buffers); ties go to the request's own
    context, the most specific source. Each finished request's output joins the index's
    dynamic side as a past generation."""

    index: SuffixIndex
    min_match_tokens: int = 2
    max_match_tokens: int = 64
    record_generations: bool = True
    name: str = "index"

    def start(self, prompt_ids: Sequence[int], prediction: Sequence[int] = ()) -> _LookupSession:
        matcher = ContextMatcher(prompt_ids, max_match=self.max_match_tokens)
        return _LookupSession(matcher, self.min_match_tokens, self.index, self.record_generations,
                              prediction=_predicted(prediction))


def _predicted(prediction: Sequence[int]) -> PredictionMatcher | None:
    return PredictionMatcher(prediction) if len(prediction) else None


@dataclass
class _LookupSession:
    matcher: ContextMatcher  # the request's own context
    min_match_tokens: int
    index: SuffixIndex | None = None
    record_generations: bool = False
    anchor: CopyAnchor = field(default_factory=CopyAnchor)  # where an edit's output copies from
    prediction: PredictionMatcher | None = None  # the request's predicted output (index/prediction.py)

    def extend(self, token_ids: Iterable[int]) -> None:
        start = len(self.matcher)
        self.matcher.extend(token_ids)
        self.anchor.extend(self.matcher.tokens, start, len(self.matcher) - start)
        if self.prediction is not None:
            self.prediction.extend(self.matcher.tokens[start:].tolist())

    def draft(self, budget: int, tree: bool = False) -> Draft:
        if budget <= 0:
            return Draft.empty("context")
        own, indexed = self._matches(budget, tree, depth=None)
        best = indexed if indexed is not None and indexed.match_len > own.match_len else own
        predicted = self._predicted(budget)
        if predicted is not None and predicted.match_len > best.match_len:
            best = predicted  # the copy pointer's run, or a longer match, in the prediction
        if best.match_len < ANCHOR_MIN_MATCH:
            # a short match mid-edit is mostly spurious: resume the copy the output left
            matched = best.match_len >= self.min_match_tokens and len(best) > 0
            room = budget - len(best) if tree and matched else budget
            anchored = self.anchor.draft(self.matcher.tokens, len(self.matcher), room, tree)
            if anchored.source == ANCHOR and len(anchored):
                return anchored  # the copy resumed: that beats a short match
            if len(anchored) and tree and matched:
                return best.with_roots(anchored)  # trees keep the match and add the guesses
            if len(anchored) and not matched:
                return anchored  # guesses where nothing else drafts
        if tree:  # both sources already keep a tree no deeper than asked
            return best if best.match_len >= self.min_match_tokens else Draft.empty(best.source)
        return _k_for_k(best, budget, self.min_match_tokens)

    def candidates(self, budget: int) -> list[Draft]:
        if budget <= 0:
            return []
        own, indexed = self._matches(budget, tree=True, depth=budget)
        anchored = self.anchor.draft(self.matcher.tokens, len(self.matcher), budget, tree=True)
        # every match counts, one token long too (`min_match_tokens` is the fixed policies'
        # guard): a caller that prices nodes by calibrated acceptance drops what won't pay
        return [d for d in (own, indexed, anchored, self._predicted(budget)) if d is not None and len(d)]

    def _predicted(self, budget: int) -> Draft | None:
        return None if self.prediction is None else self.prediction.draft(self.matcher.tokens, budget)

    def _matches(self, budget: int, tree: bool, depth: int | None) -> tuple[Draft, Draft | None]:
        """Drafts from the longest match in the request's own context and in the index
        (None without one); the anchor learns where the output copies from."""
        own = self.matcher.draft(max_tokens=budget, tree=tree, max_depth=depth)
        self.anchor.observe(*self.matcher.last_match)
        if self.index is None:
            return own, None
        longest = self.matcher.max_match
        indexed = self.index.draft(self.matcher.tokens[-longest:], max_tokens=budget, max_match=longest,
                                   tree=tree, max_depth=depth)
        return own, indexed

    def state(self) -> tuple:
        """What `extend`, `draft` and `candidates` change: the context's length, its last
        match, the copy anchor's place. `set_state` returns to it (a look ahead, engine.py)."""
        anchor, predicted = self.anchor, None if self.prediction is None else self.prediction.state()
        return len(self.matcher), self.matcher.last_match, anchor.pos, anchor.off, anchor.copied, predicted

    def set_state(self, state: tuple) -> None:
        length, self.matcher.last_match, self.anchor.pos, self.anchor.off, self.anchor.copied, predicted = state
        self.matcher.truncate(length)
        if self.prediction is not None:
            self.prediction.set_state(predicted)

    def finish(self, generated: Sequence[int]) -> None:
        if self.index is not None and self.record_generations and generated:
            self.index.add_document(f"gen:{uuid.uuid4().hex}", generated)


def _k_for_k(draft: Draft, budget: int, min_match: int) -> Draft:
    """The policy: nothing below `min_match`; else at most k tokens for a k-token match."""
    if draft.match_len < min_match:
        return Draft.empty(draft.source)
    return draft.truncated(min(budget, draft.match_len))


@dataclass(frozen=True)
class NoProposer:
    """Speculation off: every verify pass is a plain decode step."""

    name: str = "none"

    def start(self, prompt_ids: Sequence[int], prediction: Sequence[int] = ()) -> _NoSession:
        return _NoSession()


class _NoSession:
    def extend(self, token_ids: Iterable[int]) -> None:
        pass

    def draft(self, budget: int, tree: bool = False) -> Draft:
        return Draft.empty("none")

    def candidates(self, budget: int) -> list[Draft]:
        return []

    def finish(self, generated: Sequence[int]) -> None:
        pass


# A registry, not an if/elif chain: later issues add the suffix index and trees here.
PROPOSERS: dict[str, Callable[..., Proposer]] = {
    "prompt": PromptLookupProposer,
    "index": IndexedProposer,
    "none": NoProposer,
}
