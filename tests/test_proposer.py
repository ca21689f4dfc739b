from __future__ import annotations

from codespec.index import SuffixIndex
from codespec.policy.proposer import PROPOSERS, IndexedProposer, NoProposer, PromptLookupProposer


def test_draft_length_follows_the_match():
    session = PromptLookupProposer(min_match_tokens=1).start([1, 2, 3, 4, 5, 6, 1])
    assert session.draft(budget=16).token_ids == (2,)  # a 1-token match drafts 1 token
    session.extend([2, 3])
    assert session.draft(budget=16).token_ids == (4, 5, 6)  # 3-token match: 3 tokens


def test_budget_caps_and_short_matches_are_refused():
    session = PromptLookupProposer(min_match_tokens=2).start([1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 4])
    assert session.draft(budget=2).token_ids == (5, 6)
    assert session.draft(budget=0).token_ids == ()
    assert PromptLookupProposer(min_match_tokens=2).start([1, 2, 3, 1]).draft(8).token_ids == ()


def test_no_proposer_never_drafts():
    session = NoProposer().start([1, 2, 1, 2, 1])
    assert session.draft(8).token_ids == ()
    assert session.candidates(8) == []


def test_candidates_offer_every_source_deep_and_short_matches_too():
    index = SuffixIndex.build({"lib.py": [7, 1, 9, 10, 11, 12, 13, 14]})
    session = IndexedProposer(index, min_match_tokens=2).start([1, 2, 3, 4, 5, 6, 7, 1])
    own, indexed = session.candidates(budget=6)
    # own context: [1] -> 2 3 4 5 6 7 (a one-token match, which chains and fixed trees refuse)
    assert (own.source, own.match_len, own.token_ids) == ("context", 1, (2, 3, 4, 5, 6, 7))
    assert session.draft(6, tree=True).source == "static"  # fixed policies: the longest match
    # the index: [7, 1] -> 9 10 11 12 13 14, deeper than k tokens for the 2-token match
    assert (indexed.source, indexed.match_len, indexed.token_ids) == ("static", 2, (9, 10, 11, 12, 13, 14))
    assert session.candidates(budget=0) == []


def test_registry_names():
    assert set(PROPOSERS) >= {"prompt", "none"}
