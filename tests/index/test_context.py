"""ContextMatcher against a brute-force scan, on tables and on random sequences."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from codespec.index import ContextMatcher


def brute_force_match(tokens: list[int], max_match: int) -> tuple[int, list[int]]:
    n = len(tokens)
    best, ends = 0, []
    for length in range(1, min(max_match, n - 1) + 1):
        suffix = tokens[n - length :]
        hits = [e for e in range(length - 1, n - 1) if tokens[e - length + 1 : e + 1] == suffix]
        if not hits:
            break
        best, ends = length, hits
    return best, ends


@pytest.mark.parametrize(
    "tokens, length, draft",
    [
        ([], 0, ()),
        ([7], 0, ()),
        ([1, 2, 3], 0, ()),  # the last token never occurred before
        ([1, 2, 3, 1], 1, (2, 3, 1)),
        ([5, 1, 2, 3, 4, 1, 2], 2, (3, 4, 1, 2)),
        ([4, 4, 4, 4], 3, (4,)),  # overlapping occurrences continue into the suffix
        ([1, 9, 1, 8, 1, 8, 1], 3, (8, 1)),  # [1, 8, 1] is the longest match
        ([1, 2, 1, 3, 1, 3, 1], 3, (3, 1)),
    ],
)
def test_table(tokens, length, draft):
    m = ContextMatcher(tokens)
    assert m.longest_match()[0] == length
    assert m.draft(max_tokens=8).token_ids == draft


def test_most_frequent_continuation_wins_and_ties_go_to_latest():
    # after [9] came 1 twice and 2 once: 1 wins on frequency
    d = ContextMatcher([9, 1, 8, 9, 1, 7, 9, 2, 5, 9]).draft(1)
    assert d.token_ids == (1,) and d.counts == (2,) and d.match_len == 1
    # after [9] came 1 once and 2 once: the latest (2) wins the tie
    d = ContextMatcher([9, 1, 9, 2, 9]).draft(1)
    assert d.token_ids == (2,) and d.counts == (1,)


def test_max_match_caps_the_match():
    tokens = [1, 2, 3, 4, 5, 6] * 3
    assert ContextMatcher(tokens, max_match=4).longest_match()[0] == 4
    assert ContextMatcher(tokens, max_match=64).longest_match()[0] == 12


def test_extend_grows_past_initial_capacity():
    m = ContextMatcher()
    pattern = list(range(100))
    for _ in range(30):
        m.extend(pattern)
    assert len(m) == 3000
    assert m.draft(5).token_ids == (0, 1, 2, 3, 4)


def test_rejects_bad_token_ids():
    with pytest.raises(ValueError):
        ContextMatcher([1, -2])
    with pytest.raises(ValueError):
        ContextMatcher(max_match=0)


@settings(max_examples=300, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 4), min_size=0, max_size=80),
    max_match=st.integers(1, 12),
    max_tokens=st.integers(0, 10),
)
def test_matches_brute_force(tokens, max_match, max_tokens):
    m = ContextMatcher(tokens, max_match=max_match)
    length, ends = m.longest_match()
    want_length, want_ends = brute_force_match(tokens, max_match)
    assert length == want_length
    assert list(ends) == want_ends
    draft = m.draft(max_tokens)
    if length == 0 or max_tokens == 0:
        assert len(draft) == 0
        return
    # Brute force the most-frequent-path rule from the same occurrence set.
    positions = [e + 1 for e in want_ends]
    expect, counts = [], []
    while len(expect) < max_tokens:
        positions = [p for p in positions if p < len(tokens)]
        if not positions:
            break
        values = [tokens[p] for p in positions]
        best = max(set(values), key=lambda v: (values.count(v), max(i for i, x in enumerate(values) if x == v)))
        expect.append(best)
        counts.append(values.count(best))
        positions = [p + 1 for p, v in zip(positions, values) if v == best]
    assert draft.token_ids == tuple(expect)
    assert draft.counts == tuple(counts)
    assert draft.match_len == length and draft.is_chain


def test_random_large_sequence_against_brute_force():
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 6, size=2000).tolist()
    for cut in (50, 500, 1999):
        prefix = tokens[:cut]
        assert ContextMatcher(prefix, max_match=16).longest_match()[0] == brute_force_match(prefix, 16)[0]


def test_trees_run_deeper_than_the_match_only_when_asked():
    from codespec.index import ContextMatcher

    m = ContextMatcher([1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2])  # a 2-token match, 7 tokens follow it
    assert m.draft(16, tree=True).token_ids == (3, 4)  # k tokens for a k-token match
    assert m.draft(16, tree=True, max_depth=16).token_ids == (3, 4, 5, 6, 7, 8, 9, 1, 2)
    assert m.draft(5, tree=True, max_depth=16).token_ids == (3, 4, 5, 6, 7)  # the node budget still holds
