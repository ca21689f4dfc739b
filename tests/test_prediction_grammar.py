"""Predicted outputs and grammars on the engine: output identical to plain decoding.

float64 tiny models (tests/tiny.py). A prediction only drafts: a right one is accepted
many tokens a pass, a wrong one costs rows, and neither changes a token. A grammar masks
every row of a pass by its state after the row's path; plain decoding under the same
grammar is the reference. The toy grammar here forbids, at each place, the tokens that
the place's rule rules out (state-dependent, so a row's mask must follow its own path).
"""

from __future__ import annotations

import numpy as np
import pytest

from codespec.engine.engine import Engine, GenerationConfig
from codespec.forward.select import of_model
from codespec.index import Draft
from codespec.policy.proposer import PromptLookupProposer
from codespec.verify.grammar import prune
from tests.test_engine_lossless import prompts
from tests.tiny import tiny_model

VOCAB = 16


class Toy:
    """Token t is allowed after output o when (t + sum(o)) % 3 != 0."""

    def __init__(self) -> None:
        self.total = 0
        self.consumed = 0

    def allowed(self) -> np.ndarray:
        return (np.arange(VOCAB) + self.total) % 3 != 0

    def consume(self, token: int) -> None:
        assert self.allowed()[token], "a token the mask forbids was committed"
        self.total += token
        self.consumed += 1

    def valid_prefix(self, tokens) -> int:
        total = self.total
        for i, t in enumerate(tokens):
            if (t + total) % 3 == 0:
                return i
            total += t
        return len(tokens)

    def describe(self) -> str:
        return "toy"


class ToyGrammar:
    def __init__(self) -> None:
        self.started: list[Toy] = []

    def start(self) -> Toy:
        self.started.append(Toy())
        return self.started[-1]


def test_a_prediction_drafts_and_never_changes_the_output():
    model = tiny_model("qwen2", vocab_size=VOCAB, seed=3)
    engine = Engine(of_model(model), None, PromptLookupProposer(min_match_tokens=1), max_draft_tokens=8,
                    eos_token_ids=[])
    by_prediction = 0
    for prompt in prompts(VOCAB, 6, seed=5, repeat=False):
        plain = engine.generate(prompt, GenerationConfig(40, speculate=False))
        right = engine.generate(prompt, GenerationConfig(40, prediction=tuple(plain.token_ids)))
        edited = plain.token_ids[:10] + [3, 4] + plain.token_ids[12:]  # a prediction wrong in the middle
        wrong = engine.generate(prompt, GenerationConfig(40, prediction=tuple(edited)))
        noise = engine.generate(prompt, GenerationConfig(40, prediction=tuple(range(VOCAB)) * 3))
        assert right.token_ids == wrong.token_ids == noise.token_ids == plain.token_ids
        by_prediction += right.stats.accepted_by_source.get("prediction", 0)
        assert right.stats.verify_passes < plain.stats.verify_passes / 2
    assert by_prediction > 100


def test_a_prediction_longer_than_the_context_is_refused():
    from codespec.errors import RequestError

    engine = Engine(of_model(tiny_model("qwen2", vocab_size=VOCAB, seed=3)), None, eos_token_ids=[])
    with pytest.raises(RequestError, match="prediction has"):
        engine.start([1, 2], GenerationConfig(4, prediction=(1,) * engine.context_limit))


def test_grammar_constrained_output_is_the_same_with_drafts():
    model = tiny_model("qwen2", vocab_size=VOCAB, seed=3)
    engine = Engine(of_model(model), None, PromptLookupProposer(min_match_tokens=1), max_draft_tokens=8,
                    eos_token_ids=[])
    accepted = differs = 0
    for prompt in prompts(VOCAB, 8, seed=7, repeat=True):
        plain = engine.generate(prompt, GenerationConfig(40, grammar=ToyGrammar(), speculate=False))
        spec = engine.generate(prompt, GenerationConfig(40, grammar=ToyGrammar()))
        assert spec.token_ids == plain.token_ids
        assert Toy().valid_prefix(plain.token_ids) == len(plain.token_ids)  # the output follows the grammar
        free = engine.generate(prompt, GenerationConfig(40, speculate=False))
        differs += free.token_ids != plain.token_ids  # the grammar changed something
        accepted += spec.stats.accepted_draft_tokens
    assert accepted > 20 and differs


def test_sampled_output_follows_the_grammar_with_drafts():
    """Sampling draws differently with drafts (lossless in distribution: sample_step, as
    tests/test_sampling.py checks); every draw follows the grammar."""
    model = tiny_model("qwen2", vocab_size=VOCAB, seed=3)
    engine = Engine(of_model(model), None, PromptLookupProposer(min_match_tokens=1), max_draft_tokens=8,
                    eos_token_ids=[])
    for seed, prompt in enumerate(prompts(VOCAB, 6, seed=7, repeat=True)):
        for speculate in (True, False):
            out = engine.generate(prompt, GenerationConfig(30, grammar=ToyGrammar(), temperature=0.8, seed=seed,
                                                           speculate=speculate))
            assert Toy().valid_prefix(out.token_ids) == len(out.token_ids) == 30


def test_drafts_are_pruned_where_the_grammar_forbids_a_token():
    toy = Toy()  # nothing consumed: token t allowed when t % 3 != 0, then by the running sum
    draft = Draft((1, 2, 4, 3, 5), (-1, 0, 1, -1, 0), (2, 1, 1, 1, 1), 2, "context")
    # 1 (sum 1) ok; 2 (1+2=3) forbidden; 4 below it gone; 3 (0+3) forbidden; 5 after 1: (5+1)%3 == 0 forbidden
    assert prune(draft, toy).token_ids == (1,)
