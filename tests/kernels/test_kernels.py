"""Every Triton kernel against its torch reference, on small random trees (interpreter)."""

from __future__ import annotations

import random

import pytest
import torch

from codespec.kernels.compact import compact_kv, compact_kv_ref
from codespec.kernels.tree_mask import tree_mask, tree_mask_ref

pytest.importorskip("triton", reason="triton is a test dependency (pip install -e '.[test]')")


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


def random_parents(rng: random.Random, batch: int, max_nodes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(parents [batch, max_nodes] with -1 padding, sizes [batch]) of random trees."""
    sizes = [rng.randint(1, max_nodes) for _ in range(batch)]
    parents = torch.full((batch, max_nodes), -1, dtype=torch.int64)
    for b, size in enumerate(sizes):
        for i in range(1, size):
            parents[b, i] = rng.randrange(i)
    return parents, torch.tensor(sizes)


@pytest.mark.parametrize("seed", range(4))
def test_tree_mask_kernel_matches_reference(seed):
    rng = random.Random(seed)
    parents, sizes = random_parents(rng, batch=3, max_nodes=8)
    expected = tree_mask_ref(parents, sizes)
    assert torch.equal(tree_mask(parents, sizes, force_triton=True), expected)
    for b, size in enumerate(sizes.tolist()):  # each row: itself, its parent's row, nothing else
        for i in range(1, size):
            parent_row = expected[b, int(parents[b, i])].clone()
            parent_row[i] = True
            assert torch.equal(expected[b, i], parent_row)


def test_wrappers_reject_bad_arguments():
    with pytest.raises(ValueError, match="int64"):
        compact_kv(torch.zeros(2, 2, 8, 4), torch.tensor([0], dtype=torch.int32), torch.tensor([0]),
                   torch.zeros(1, 2, dtype=torch.int64), torch.tensor([1]))
    with pytest.raises(ValueError, match="contiguous"):
        compact_kv(torch.zeros(2, 2, 8, 4).transpose(2, 3), torch.tensor([0]), torch.tensor([0]),
                   torch.zeros(1, 2, dtype=torch.int64), torch.tensor([1]))
    with pytest.raises(ValueError, match="parents"):
        tree_mask(torch.zeros(3, dtype=torch.int64), torch.tensor([3]))
