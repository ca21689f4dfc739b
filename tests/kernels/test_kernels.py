"""Every Triton kernel against its torch reference, on small random trees (interpreter)."""

from __future__ import annotations

import random

import pytest
import torch

from codespec.kernels.accept import tree_accept, tree_accept_ref
from codespec.kernels.compact import compact_kv, compact_kv_ref
from codespec.kernels.tree_mask import tree_mask, tree_mask_ref

pytest.importorskip("triton", reason="triton is a test dependency (pip install -e '.[test]')")


def random_trees(rng: random.Random, batch: int, max_nodes: int, vocab: int):
    """Trees of random shape whose tokens often equal the argmax of their parent's row,
    so acceptance walks a few levels deep."""
    sizes = [rng.randint(1, max_nodes) for _ in range(batch)]
    offsets = [sum(sizes[:b]) for b in range(batch)]
    logits = torch.randn(sum(sizes), vocab)
    choices = logits.argmax(-1).tolist()
    tokens = torch.zeros(batch, max_nodes, dtype=torch.int64)
    parents = torch.full((batch, max_nodes), -1, dtype=torch.int64)
    for b, size in enumerate(sizes):
        for i in range(1, size):
            parent = rng.randrange(i)
            parents[b, i] = parent
            match = rng.random() < 0.7
            tokens[b, i] = choices[offsets[b] + parent] if match else rng.randrange(vocab)
    return logits, torch.tensor(offsets), torch.tensor(sizes), tokens, parents


def test_accept_kernel_matches_reference():
    rng = random.Random(0)
    walked = 0
    for _ in range(10):
        vocab = rng.choice([7, 1000, 2500])  # below, at and across the 1024-wide tile
        args = random_trees(rng, batch=rng.randint(1, 4), max_nodes=rng.randint(1, 9), vocab=vocab)
        expected = tree_accept_ref(*args)
        got = tree_accept(*args, force_triton=True)
        for e, g in zip(expected, got):
            assert torch.equal(e, g)
        walked += int(expected[0].sum())
    assert walked > 5  # the trees were accepted several levels deep, not just rejected


def test_accept_ties_keep_the_first_index():
    logits = torch.zeros(1, 3000)
    logits[0, 1500] = logits[0, 2900] = 1.0  # the same maximum in two tiles
    args = (torch.tensor([0]), torch.tensor([1]), torch.zeros(1, 1, dtype=torch.int64),
            torch.full((1, 1), -1, dtype=torch.int64))
    assert tree_accept(logits, *args, force_triton=True)[2].tolist() == [1500]
    assert tree_accept_ref(logits, *args)[2].tolist() == [1500]


@pytest.mark.parametrize("seed", range(4))
def test_compact_kernel_matches_reference(seed):
    rng = random.Random(seed)
    slots, heads, tokens, dim = 3, 2, 24, rng.choice([4, 6])
    kv = torch.randn(slots, heads, tokens, dim)
    batch = rng.randint(1, slots)
    chosen = rng.sample(range(slots), batch)
    starts, keeps = [], []
    for _ in range(batch):
        start = rng.randint(0, 8)
        nodes = sorted(rng.sample(range(1, 12), rng.randint(0, 5)))
        starts.append(start)
        keeps.append([0, *nodes])
    width = max(len(k) for k in keeps)
    src = torch.tensor([k + [-1] * (width - len(k)) for k in keeps])
    args = (torch.tensor(chosen), torch.tensor(starts), src, torch.tensor([len(k) for k in keeps]))
    expected, got = kv.clone(), kv.clone()
    compact_kv_ref(expected, *args)
    compact_kv(got, *args, force_triton=True)
    assert torch.equal(expected, got)
    assert not torch.equal(expected, kv) or all(k == list(range(len(k))) for k in keeps)


@pytest.mark.parametrize("seed", range(4))
def test_tree_mask_kernel_matches_reference(seed):
    rng = random.Random(seed)
    _, _, sizes, _, parents = random_trees(rng, batch=3, max_nodes=8, vocab=5)
    expected = tree_mask_ref(parents, sizes)
    assert torch.equal(tree_mask(parents, sizes, force_triton=True), expected)
    for b, size in enumerate(sizes.tolist()):  # each row: itself, its parent's row, nothing else
        for i in range(1, size):
            parent_row = expected[b, int(parents[b, i])].clone()
            parent_row[i] = True
            assert torch.equal(expected[b, i], parent_row)


def test_wrappers_reject_bad_arguments():
    logits = torch.zeros(4, 10)
    with pytest.raises(ValueError, match="int64"):
        tree_accept(logits, torch.tensor([0]), torch.tensor([4]), torch.zeros(1, 4, dtype=torch.int32),
                    torch.zeros(1, 4, dtype=torch.int32))
    with pytest.raises(ValueError, match="contiguous"):
        compact_kv(torch.zeros(2, 2, 8, 4).transpose(2, 3), torch.tensor([0]), torch.tensor([0]),
                   torch.zeros(1, 2, dtype=torch.int64), torch.tensor([1]))
    with pytest.raises(ValueError, match="parents"):
        tree_mask(torch.zeros(3, dtype=torch.int64), torch.tensor([3]))
