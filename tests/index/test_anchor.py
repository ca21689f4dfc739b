"""Copy anchors: after an edit changes copied code, drafting resumes the copy at once."""

from __future__ import annotations

from codespec.index.anchor import GUESS, MAX_DEVIATION, SOURCE
from codespec.policy.proposer import PromptLookupProposer

SOURCE_CODE = list(range(1, 14))  # the code the instruction quotes
PROMPT = [90, 91, *SOURCE_CODE, 92, 93]


def copying(upto: int):
    """A session whose output has copied SOURCE_CODE[:upto] (a long match: anchored)."""
    session = PromptLookupProposer().start(PROMPT)
    session.extend(SOURCE_CODE[:upto])
    assert session.draft(16).token_ids[:2] == tuple(SOURCE_CODE[upto:upto + 2])
    return session


def test_an_insertion_is_followed_by_the_rest_of_the_copy():
    session = copying(7)
    session.extend([77])  # the answer inserts a token the source does not have
    chain = session.draft(16)
    assert chain.source == GUESS and chain.token_ids[:3] == (8, 9, 10)
    tree = session.draft(16, tree=True)  # branches: at the anchor, 1 and 2 tokens past it
    roots = [t for t, p in zip(tree.token_ids, tree.parents) if p == -1]
    assert roots == [8, 9, 10] and tree.is_valid_tree


def test_a_substitution_resumes_where_the_copy_matches_again():
    session = copying(7)
    session.extend([77, 9])  # 77 replaced source token 8; then the copy goes on with 9
    draft = session.draft(16)
    assert draft.source == SOURCE and draft.token_ids[:3] == (10, 11, 12)


def test_chains_keep_a_real_match_over_guesses():
    session = PromptLookupProposer().start([50, 51, 52, 53, *PROMPT])
    session.extend(SOURCE_CODE[:7])
    session.draft(16)  # the engine drafts before every pass: the long match anchors the copy
    session.extend([77, 50, 51])  # the deviation now matches other text: [50, 51] -> 52 53
    assert session.draft(16).token_ids[:2] == (52, 53)
    tree = session.draft(16, tree=True)  # fixed trees keep the match and add the guesses as roots
    roots = [t for t, p in zip(tree.token_ids, tree.parents) if p == -1]
    assert tree.token_ids[:2] == (52, 53) and roots[1:] == [8, 9, 10] and tree.is_valid_tree
    # the goodput controller gets both, each to be priced by its own calibrated rate
    sources = {d.source for d in session.candidates(16)}
    assert sources == {"context", GUESS}


def test_a_long_rewrite_forgets_the_anchor():
    session = copying(7)
    session.extend([200 + i for i in range(MAX_DEVIATION + 1)])
    assert session.draft(16).token_ids == ()
    assert session.draft(16, tree=True).token_ids == ()


def test_a_short_match_anchors_once_the_output_copied_enough():
    session = PromptLookupProposer().start(PROMPT)
    session.extend(SOURCE_CODE[:2])  # a 2-token match: a candidate, not yet an anchor
    (deep,) = session.candidates(16)  # candidates run past k tokens for a k-token match
    assert deep.token_ids[:5] == (3, 4, 5, 6, 7)
    session.extend([3, 4, 5, 6])  # the model accepted the deep draft: 6 tokens copied
    session.extend([77])  # then deviated
    assert session.draft(16, tree=True).source == GUESS


def test_a_candidate_that_stops_copying_early_is_dropped():
    session = PromptLookupProposer().start(PROMPT)
    session.extend(SOURCE_CODE[:2])
    session.draft(16)
    session.extend([3, 77])  # 3 tokens copied, then something else: not an edit's copy
    assert session.draft(16, tree=True).token_ids == ()
