from __future__ import annotations

from codespec.proposer import PROPOSERS, NoProposer, PromptLookupProposer


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


def test_registry_names():
    assert set(PROPOSERS) >= {"prompt", "none"}
