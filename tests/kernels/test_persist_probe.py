"""The persistent-kernel probe (scripts/gpu_persist.py) under the interpreter: the chain
of products in one launch with grid barriers, one program (the interpreter runs programs
one after another, so a barrier of two could never meet); in launches of one product,
any number of programs. What only a GPU shows, the timings, waits for the `persist`
stage; its sm_90 build is checked in test_sm90_compile.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton", reason="triton is a test dependency (pip install -e '.[test]')")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
gpu_persist = pytest.importorskip("gpu_persist")

# The layer's shape rules at a size the interpreter runs quickly: o reads q/k/v's first
# outputs, gate/up o's, down gate/up's first, and the next q/k/v down's.
SMALL = ((48, 32), (32, 32), (64, 32), (32, 64))


def small_chain(layers: int = 2) -> "gpu_persist.Chain":
    return gpu_persist.Chain(layers, "cpu", layer=SMALL, block_n=8, block_k=16, block_k_long=32)


def test_one_persistent_launch_computes_the_launched_products_bits_and_torchs_chain():
    chain = small_chain()
    persistent = chain.run(1, per_launch=8).clone()
    assert int(chain.sync) == 7 and int(chain.flag) == 0  # seven barriers, each met
    for programs in (1, 3):  # which program computes a block changes nothing
        assert torch.equal(chain.run(programs, per_launch=1), persistent), programs
    torch.testing.assert_close(persistent, chain.reference(), rtol=1e-5, atol=1e-5)
    assert chain.bytes == 2 * sum(n * k for n, k in SMALL) * 2


def test_the_barriers_alone_meet_as_often_as_the_products_do():
    chain = small_chain()
    chain.a.fill_(7.0)
    chain.run(1, per_launch=8, work=False)
    assert int(chain.sync) == 7 and int(chain.flag) == 0
    assert torch.equal(chain.a[:32], chain.x)  # no product ran: the input as it was copied in


def test_a_barrier_the_grid_cannot_meet_gives_up_and_says_so():
    """Two programs run one after the other here, as they would on a GPU with too few
    free SMs: the first waits `spin_limit` reads, then goes on and raises the flag."""
    chain = small_chain(layers=1)
    chain.run(2, per_launch=4, spin_limit=3)
    assert int(chain.flag) == 1


def test_launches_that_wait_on_the_count_of_stores_compute_the_same_bits():
    """`launched flags`: one launch a product, each waiting for every program of the
    launches before to have counted its stores (here they have: the interpreter runs
    launches one after another), then counting its own."""
    chain = small_chain()
    launched = chain.run(3, per_launch=1).clone()
    chain.flag.zero_()
    assert torch.equal(chain.run(3, per_launch=1, flags=True), launched)
    assert int(chain.sync) == 8 * 3 and int(chain.flag) == 0  # every program of the eight launches counted
    with pytest.raises(AssertionError, match="launches of one product"):
        chain.run(3, per_launch=2, flags=True)
