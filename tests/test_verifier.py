"""Greedy acceptance on hand-built logits."""

from __future__ import annotations

import pytest
import torch

from codespec.policy.tree import VerifyTree
from codespec.engine.verifier import batch_greedy_accept, greedy_accept


def logits_for(argmaxes: list[int], vocab: int = 8) -> torch.Tensor:
    out = torch.zeros(len(argmaxes), vocab)
    for row, token in enumerate(argmaxes):
        out[row, token] = 1.0
    return out


@pytest.mark.parametrize(
    "argmaxes, draft, accepted, committed",
    [
        ([3], [], 0, (3,)),  # no draft: a plain decode step
        ([3, 4, 5], [3, 4], 2, (3, 4, 5)),  # all accepted: bonus from the last row
        ([3, 4, 5], [2, 4], 0, (3,)),  # first rejected: later matches don't count
        ([3, 4, 5, 6], [3, 7, 5], 1, (3, 4)),  # middle mismatch: bonus replaces it
    ],
)
def test_greedy_accept(argmaxes, draft, accepted, committed):
    result = greedy_accept(logits_for(argmaxes), VerifyTree.chain(0, draft))
    assert result.accepted == accepted
    assert result.committed == committed


def test_ties_resolve_to_the_first_index_like_plain_argmax():
    logits = torch.zeros(2, 8)
    logits[0, 2] = logits[0, 5] = 1.0
    assert greedy_accept(logits, VerifyTree.chain(0, [5])).committed == (2,)


# Tree rows: node i's row holds the model's choice after node i.
#   tree: pending -> a(1) -> c(3)      choices: after pending 1, after a 6, after b 9,
#                 -> b(2) -> d(4)                after c 7, after d 8
TREE = VerifyTree((0, 1, 2, 6, 9), (-1, 0, 0, 1, 2), (0, 1, 1, 2, 2), (0, 1, 2, 3))


@pytest.mark.parametrize(
    "argmaxes, path, committed",
    [
        ([1, 6, 9, 7, 8], (1, 3), (1, 6, 7)),  # the first branch all the way: bonus after c
        ([2, 6, 9, 7, 8], (2, 4), (2, 9, 8)),  # the second branch: its row decides
        ([2, 6, 5, 7, 8], (2,), (2, 5)),  # second branch, then a mismatch
        ([4, 6, 9, 7, 8], (), (4,)),  # no child matches: a plain step
    ],
)
def test_tree_accept_follows_the_models_choices(argmaxes, path, committed):
    result = greedy_accept(logits_for(argmaxes, vocab=10), TREE)
    assert (result.path, result.committed, result.accepted) == (path, committed, len(path))


def test_batched_acceptance_equals_one_request_at_a_time():
    first, second = logits_for([1, 6, 9, 7, 8], vocab=10), logits_for([3, 4, 5], vocab=10)
    chain = VerifyTree.chain(0, [3, 4])
    batched = batch_greedy_accept(torch.cat([first, second]), [0, 5], [TREE, chain])
    assert batched == [greedy_accept(first, TREE), greedy_accept(second, chain)]
