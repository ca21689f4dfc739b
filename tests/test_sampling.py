"""Speculative sampling keeps the target distribution (statistical tests)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from scipy.stats import chi2_contingency, chisquare

from codespec.engine.engine import Engine, GenerationConfig
from tests.tiny import tiny_model
from codespec.policy.proposer import PromptLookupProposer
from codespec.verify.sampling import SamplingParams, sample_accept, target_probs
from codespec.verify.tree import VerifyTree
from codespec.forward.select import of_model

P_VALUE = 1e-3  # a true distribution mismatch at these sample sizes gives p << 1e-6


def test_top_k_and_top_p_cuts():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert torch.allclose(target_probs(logits, SamplingParams(1.0, top_k=2)), torch.tensor([[0.625, 0.375, 0, 0]]))
    assert torch.allclose(target_probs(logits, SamplingParams(1.0, top_p=0.8)), torch.tensor([[0.625, 0.375, 0, 0]]))
    assert torch.allclose(target_probs(logits, SamplingParams(1.0, top_p=0.81)),
                          torch.tensor([[0.5, 0.3, 0.15, 0]]) / 0.95)
    sharp = target_probs(logits, SamplingParams(0.05))
    assert sharp[0, 0] > 0.99


@pytest.mark.parametrize("draft_token", [0, 1, 3])
def test_one_position_matches_the_target(draft_token):
    p = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = torch.log(p).repeat(2, 1)
    generator = torch.Generator().manual_seed(0)
    n = 20000
    tree = VerifyTree.chain(9, [draft_token])
    firsts = Counter(sample_accept(logits, tree, SamplingParams(1.0), generator).committed[0] for _ in range(n))
    observed = [firsts[t] for t in range(4)]
    assert chisquare(observed, (p * n).tolist()).pvalue > P_VALUE


def test_multi_draft_tree_keeps_the_target_at_two_levels():
    """Root children 0 and 1 (both often sampled), node 0 has children 2 and 3: the first
    two committed tokens must follow p(first) * p(second | first)."""
    p_root = torch.tensor([0.4, 0.35, 0.2, 0.05])
    p_next = torch.tensor([0.1, 0.2, 0.3, 0.4])  # the row after node 0 and after node 1
    tree = VerifyTree((9, 0, 2, 3, 1), (-1, 0, 1, 1, 0), (0, 1, 2, 2, 1), (0, 1, 2, 3))
    logits = torch.log(torch.stack([p_root, p_next, p_next, p_next, p_next]))
    generator = torch.Generator().manual_seed(1)
    n = 20000
    pairs = Counter()
    for _ in range(n):
        result = sample_accept(logits, tree, SamplingParams(1.0), generator)
        if result.path[:1] in ((1,), (4,)):  # a root child was accepted: a second token follows
            pairs[result.committed[:2]] += 1
        else:
            pairs[(result.committed[0], None)] += 1
    expected, observed = [], []
    for first in range(4):
        if first in (0, 1):
            for second in range(4):
                expected.append(float(p_root[first] * p_next[second] * n))
                observed.append(pairs[(first, second)])
        else:
            expected.append(float(p_root[first] * n))
            observed.append(pairs[(first, None)])
    assert sum(observed) == n
    expected = [e * n / sum(expected) for e in expected]  # float32 probabilities: rescale exactly
    assert chisquare(observed, expected).pvalue > P_VALUE


def test_engine_sampling_distribution_equals_plain_sampling():
    """Token 3 of each run, over 1,500 seeds, with speculation on and off."""
    model = tiny_model("qwen2", vocab_size=16, seed=3)
    engine = Engine(of_model(model), None, PromptLookupProposer(min_match_tokens=1), max_draft_tokens=4, eos_token_ids=[])
    prompt = [1, 2, 3, 4, 5] * 3
    counts = {True: Counter(), False: Counter()}
    drafted = accepted = 0
    for speculate in (True, False):
        for seed in range(1500):
            out = engine.generate(prompt, GenerationConfig(max_new_tokens=4, temperature=1.3, seed=seed,
                                                           speculate=speculate))
            counts[speculate][out.token_ids[2]] += 1
            if speculate:
                drafted += out.stats.draft_tokens
                accepted += out.stats.accepted_draft_tokens
    tokens = sorted(set(counts[True]) | set(counts[False]))
    table = [[counts[s][t] + 1 for t in tokens] for s in (True, False)]  # +1 keeps empty cells defined
    assert chi2_contingency(table).pvalue > P_VALUE
    assert accepted > 50 and drafted - accepted > 200, (drafted, accepted)  # both paths ran


def test_seeded_runs_repeat_and_greedy_ignores_no_seed():
    model = tiny_model("llama", vocab_size=32, seed=1)
    engine = Engine(of_model(model), None, PromptLookupProposer(min_match_tokens=1), eos_token_ids=[])
    config = GenerationConfig(max_new_tokens=12, temperature=0.9, top_p=0.95, seed=7)
    assert engine.generate([1, 2, 3, 1, 2], config).token_ids == engine.generate([1, 2, 3, 1, 2], config).token_ids


def test_a_vanishing_temperature_is_the_argmax_not_nan():
    """Found by the HTTP fuzz: `temperature: 5e-324` is a valid request, and logit / T
    overflowed into NaN probabilities (a 500)."""
    from codespec.verify.sampling import SamplingParams, target_probs

    logits = torch.tensor([[1.0, 3.0, 2.0, 3.0], [0.5, -1.0, 4.0, 2.0]])
    for temperature in (5e-324, 1e-40, 1e-6):
        probs = target_probs(logits, SamplingParams(temperature))
        assert probs.tolist() == [[0.0, 0.5, 0.0, 0.5], [0.0, 0.0, 1.0, 0.0]]
