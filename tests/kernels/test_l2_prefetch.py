"""Warming L2 (kernels/l2_prefetch.py): the `load` mode under the Triton interpreter
covers every grain of every region once and writes nothing but its scratch words (the
PTX modes, which the interpreter cannot run, compile for an H100 in
test_sm90_compile.py). Whether warming pays is the GPU check's `step` stage."""

from __future__ import annotations

import pytest
import torch

from codespec.kernels.l2_prefetch import l2_prefetch

pytest.importorskip("triton", reason="triton is a test dependency (pip install -e '.[test]')")


def weights() -> list[torch.Tensor]:
    torch.manual_seed(0)
    return [torch.randn(1000).to(torch.bfloat16), torch.randn(64, 48).to(torch.bfloat16),
            torch.randint(-128, 127, (4096,), dtype=torch.int8), torch.randn(3, 8)]


@pytest.mark.parametrize("programs", [1, 3, 64, 700])
def test_load_mode_touches_each_grain_once_and_writes_only_the_sink(programs):
    tensors = weights()
    before = [t.clone() for t in tensors]
    sink = torch.zeros(programs, dtype=torch.int32)
    l2_prefetch(tensors, sink, mode="load", force_triton=True)
    # the sink's words sum the first byte of every 32-byte grain: each grain read exactly once
    expected = sum(int(t.view(-1).view(torch.uint8)[::32].to(torch.int64).sum()) for t in tensors)
    assert int(sink.to(torch.int64).sum()) == expected
    assert all(torch.equal(a, b) for a, b in zip(tensors, before))


def test_cpu_tensors_warm_nothing():
    sink = torch.zeros(4, dtype=torch.int32)
    l2_prefetch(weights()[:2], sink, mode="sector")
    assert not sink.any()


@pytest.mark.parametrize("bad, message", [
    (dict(mode="tlb"), "expected one of sector, bulk, load"),
    (dict(mode="load", tensors=weights() + weights()), "one to four"),
    (dict(mode="load", tensors=[torch.ones(8, 8).t()]), "contiguous"),
    (dict(mode="bulk", tensors=[torch.ones(3, dtype=torch.bfloat16)]), "multiples of 16 bytes"),
    (dict(mode="load", grain=24), "multiple of 16"),
])
def test_clear_errors(bad, message):
    args = dict(tensors=weights()[:2], mode="load") | bad
    with pytest.raises(ValueError, match=message):
        l2_prefetch(args.pop("tensors"), torch.zeros(2, dtype=torch.int32), **args)
