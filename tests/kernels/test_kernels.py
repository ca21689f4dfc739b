"""Every Triton kernel against its torch reference, on small random trees (interpreter)."""

from __future__ import annotations

import random

import pytest
import torch

from codespec.kernels.compact import compact_kv, compact_kv_ref

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


def test_wrappers_reject_bad_arguments():
    with pytest.raises(ValueError, match="int64"):
        compact_kv(torch.zeros(2, 2, 8, 4), torch.tensor([0], dtype=torch.int32), torch.tensor([0]),
                   torch.zeros(1, 2, dtype=torch.int64), torch.tensor([1]))
    with pytest.raises(ValueError, match="contiguous"):
        compact_kv(torch.zeros(2, 2, 8, 4).transpose(2, 3), torch.tensor([0]), torch.tensor([0]),
                   torch.zeros(1, 2, dtype=torch.int64), torch.tensor([1]))
