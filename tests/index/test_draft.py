from __future__ import annotations

import pytest

from codespec.index import Draft


def test_chain_and_truncation():
    d = Draft.chain([5, 6, 7], counts=[4, 3, 3], match_len=3, source="context")
    assert d.parents == (-1, 0, 1) and d.is_chain
    t = d.truncated(2)
    assert t.token_ids == (5, 6) and t.parents == (-1, 0) and t.counts == (4, 3)
    assert d.truncated(10) is d
    assert len(d.truncated(0)) == 0


def test_tree_is_not_a_chain_and_parents_must_precede_children():
    tree = Draft((1, 2, 3), (-1, 0, 0), (3, 2, 1), 2, "x")
    assert not tree.is_chain and tree.is_valid_tree
    assert not Draft((1, 2), (1, -1), (1, 1), 1, "x").is_valid_tree
    with pytest.raises(AssertionError):
        Draft((1, 2), (-1,), (1, 1), 1, "x")
