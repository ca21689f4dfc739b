"""Greedy acceptance on hand-built logits: the one rule (`accept_choices` over each row's
first maximum) and the verifier's slicing of a batched pass."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from codespec.forward.base import Forward
from codespec.engine.kvcache import SlotCache
from codespec.verify.verifier import Item, Verifier
from codespec.forward.transformers import TorchForward
from codespec.verify.tree import VerifyTree, accept_choices


def greedy_accept(logits: torch.Tensor, tree: VerifyTree):
    return accept_choices(TorchForward.argmax(None, logits), tree)  # the backends' first-maximum rule


class HandBuilt(Forward):
    """A backend whose passes return the logits it is given (the Forward protocol's surface
    the verifier uses)."""

    name, exact, min_rows, device, kv_dtype = "hand-built", True, 1, "cpu", torch.float32
    argmax, tensor = TorchForward.argmax, TorchForward.tensor

    def __init__(self, logits: torch.Tensor) -> None:
        self.rows = logits
        self.config = SimpleNamespace(num_attention_heads=1, num_hidden_layers=1, hidden_size=4)

    def probe(self, stored):
        return 0, False

    def logits(self, cache, requests):
        assert sum(len(tree) for _, _, tree in requests) == len(self.rows)
        return self.rows

    def choices(self, cache, requests):
        return self.argmax(self.logits(cache, requests))

    def keep(self, cache, moves):
        self.moved = list(moves)


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
    first, second = logits_for([2, 6, 9, 7, 8], vocab=10), logits_for([3, 4, 5], vocab=10)
    chain = VerifyTree.chain(0, [3, 4])
    forward = HandBuilt(torch.cat([first, second]))
    cache = SlotCache(forward.config, slots=2, slot_tokens=64, dtype=torch.float32)
    verifier = Verifier(forward, cache)
    for slot in (0, 1):
        cache.acquire([slot])
    batched = verifier.verify([Item(0, TREE), Item(1, chain)])
    assert batched == [greedy_accept(first, TREE), greedy_accept(second, chain)]
    assert forward.moved == [(0, 0, (2, 4))]  # the second branch won: its KV follows the context
    assert cache.length(0) == 3 and cache.length(1) == 3  # pending + accepted, each


def test_greedy_acceptance_is_the_longest_path_of_choices():
    """`accept_choices` (the one greedy rule of every backend) against a walk down the tree:
    from the root, step to the first child whose token is the choice after the current node
    (siblings of a trie differ; with repeats the first wins), then the choice after it."""
    import random

    from codespec.verify.tree import VerifyTree, accept_choices

    rng = random.Random(0)
    deep = 0
    for _ in range(300):
        nodes = rng.randint(1, 9)
        parents = [-1] + [rng.randrange(i) for i in range(1, nodes)]
        depths = [0]
        for p in parents[1:]:
            depths.append(depths[p] + 1)
        choices = [rng.randrange(4) for _ in range(nodes)]
        tokens = [0] + [choices[p] if rng.random() < 0.7 else rng.randrange(4) for p in parents[1:]]
        tree = VerifyTree(tuple(tokens), tuple(parents), tuple(depths), tuple(range(nodes - 1)))
        best: list[int] = []
        at = 0
        while True:
            step = [c for c in tree.children(at) if tokens[c] == choices[at]]
            if not step:
                break
            at = step[0]
            best.append(at)
        result = accept_choices(choices, tree)
        assert list(result.path) == best and result.committed[-1] == choices[best[-1] if best else 0]
        deep += len(best) > 1
    assert deep > 20
