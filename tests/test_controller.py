"""The goodput controller's choice among a request's draft sources (`controller.pick`)."""

from __future__ import annotations

from codespec.forward import rowplan
from codespec.policy import controller
from codespec.index import Draft

COST = controller.CostModel.of({2: 0.024, 40: 0.1})  # 20 ms + 2 ms per row


def chain(tokens, match_len, source):
    return Draft.chain(tokens, [1] * len(tokens), match_len=match_len, source=source)


def test_pick_takes_the_source_with_the_best_expected_goodput_not_the_longest_match():
    long_but_doubtful = chain([1, 2, 3], match_len=12, source="static")
    short_but_sure = chain([4, 5, 6, 7, 8], match_len=2, source="context")
    rates = {"static": 0.2, "context": 0.95}
    picked = controller.pick([long_but_doubtful, short_but_sure], lambda m, s: rates[s], COST)
    assert picked.token_ids == (4, 5, 6, 7, 8)


def test_pick_prunes_the_winner_to_what_pays_for_its_rows():
    draft = chain([1, 2, 3, 4], match_len=3, source="static")
    # one node rides free (a one-row pass is padded to two); a second one costs a row
    assert controller.pick([draft], lambda m, s: 0.01, COST).token_ids == (1,)
    assert controller.pick([], lambda m, s: 0.9, COST).token_ids == ()
    # a sure first token, then doubtful ones: only what pays for its row stays
    halves = controller.pick([draft], lambda m, s: 0.99 if m == 3 else 0.02, COST)
    assert halves.token_ids == (1,)


def test_guesses_are_priced_by_their_own_record():
    acceptance = controller.Acceptance()
    for _ in range(40):  # guesses failed, matches of the same length held
        acceptance.observe(1, False, "anchor-guess")
        acceptance.observe(1, True, "context")
    guess = chain([9, 9, 9], match_len=1, source="anchor-guess")
    match = chain([1, 2], match_len=1, source="context")
    assert controller.pick([guess, match], acceptance.rate, COST).source == "context"


def test_padded_attention_prices_every_row_at_its_calls_padded_keys():
    """With padded calls (rowcalls.py) every row of a call scores the call's keys, padded
    to whole key blocks, on the main path or off it; lean calls read each row's own keys."""
    # 20 ms + 0.5 ms per row + 10 ms per 1,000 keys read
    points = {(rows, keys): 0.02 + 0.0005 * rows + 0.00001 * keys for rows in (2, 8, 32) for keys in (500, 5000)}
    # root 1 with child 2 (the main path) and a second root 3: p = 0.525, 0.3675, 0.175
    draft = Draft((1, 2, 3), (-1, 0, -1), (3, 3, 1), match_len=4, source="index")
    rate = lambda m, s: 0.7  # noqa: E731
    padded = controller.CostModel.of(points)
    padded.key_span = rowplan.padded_length
    assert padded.attended_keys(2000, [(3, 2)]) == 3 * 2048 and padded.attended_keys(2000, [(1, 1)]) == 2048
    assert padded.row_keys(2000, 5) == 2048 and padded.row_keys(2047, 1) == 2560  # the next key block
    assert controller.choose([draft], [rate], padded, [2000])[0].token_ids == (1,)  # the second row rides free
    lean = controller.CostModel.of(points)
    assert lean.attended_keys(2000, [(3, 2)]) == 2001 + 2002 + 2003 and lean.row_keys(2000, 5) == 2006
    cheap_keys = controller.CostModel.of({(r, k): 0.02 + 0.0005 * r + 1e-7 * k for r in (2, 8, 32) for k in (500, 5000)})
    cheap_keys.key_span = rowplan.padded_length
    assert controller.choose([draft], [rate], cheap_keys, [2000])[0].token_ids == (1, 2, 3)

def test_a_drafts_keys_are_its_verify_trees_keys_in_both_layouts():
    """draft_keys (pick's shortcut: no tree built where rows read their own keys) counts
    what tree_keys counts on the tree VerifyTree.build makes, for random trees."""
    import random

    from codespec.verify.tree import VerifyTree

    rng = random.Random(0)
    for _ in range(300):
        n = rng.randrange(0, 24)
        parents = [rng.randrange(-1, i) if rng.random() < 0.4 else i - 1 for i in range(n)]
        draft = Draft(tuple(range(n)), tuple(parents), (1,) * n, match_len=3, source="index")
        for padded in (False, True):
            model = controller.CostModel(key_span=rowplan.padded_length if padded else None)
            context = rng.randrange(0, 3000)
            assert model.draft_keys(context, draft) == model.tree_keys(context, VerifyTree.build(0, draft))
