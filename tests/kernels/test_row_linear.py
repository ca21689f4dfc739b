"""The row-exact product (kernels/row_linear.py) under the Triton interpreter: equal to
its reference, and a row's bits depend on its own input row alone."""

from __future__ import annotations

import pytest
import torch

from codespec.kernels.row_linear import Config, row_linear, row_linear_ref

pytest.importorskip("triton", reason="triton is a test dependency (pip install -e '.[test]')")

CONFIGS = [Config(block_m=16, block_n=16, block_k=32), Config(block_m=16, block_n=32, block_k=16, splits=3)]


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("bias", [False, True])
def test_kernel_matches_reference(config, bias):
    torch.manual_seed(0)
    x = torch.randn(32, 96, dtype=torch.bfloat16)
    weight = torch.randn(64, 96, dtype=torch.bfloat16)
    b = torch.randn(64, dtype=torch.bfloat16) if bias else None
    got = row_linear(x, weight, b, config=config, force_triton=True)
    expected = row_linear_ref(x, weight, b)
    assert got.dtype == torch.bfloat16
    assert torch.allclose(got.float(), expected.float(), atol=0.1, rtol=1e-2)  # bf16 output rounding


@pytest.mark.parametrize("config", CONFIGS)
def test_a_rows_bits_depend_on_its_own_row_alone(config):
    torch.manual_seed(1)
    x = torch.randn(32, 96, dtype=torch.bfloat16)
    weight = torch.randn(64, 96, dtype=torch.bfloat16)
    full = row_linear(x, weight, config=config, force_triton=True)
    others = torch.randn_like(x)
    others[5] = x[5]  # row 5 alone among different rows, at another place in the block
    moved = torch.roll(others, 9, dims=0)
    assert torch.equal(row_linear(moved, weight, config=config, force_triton=True)[14], full[5])


def test_shapes_the_tiles_do_not_fit_are_refused():
    with pytest.raises(ValueError, match="does not tile"):
        row_linear(torch.randn(10, 96), torch.randn(64, 96), config=Config(block_m=16, block_n=16, block_k=32))
