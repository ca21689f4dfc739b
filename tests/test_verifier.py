"""Greedy acceptance on hand-built logits."""

from __future__ import annotations

import pytest
import torch

from codespec.verifier import greedy_accept


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
    result = greedy_accept(logits_for(argmaxes), torch.tensor(draft, dtype=torch.long))
    assert result.accepted == accepted
    assert result.committed == committed


def test_ties_resolve_to_the_first_index_like_plain_argmax():
    logits = torch.zeros(2, 8)
    logits[0, 2] = logits[0, 5] = 1.0
    assert greedy_accept(logits, torch.tensor([5])).committed == (2,)
