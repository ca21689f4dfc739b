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


FUSED = [dict(norm=True), dict(gated=True), dict(residual=True), dict(norm=True, residual=True),
         dict(gated=True, residual=True, bias=True)]


def fused_inputs(dtype, norm=False, gated=False, residual=False, bias=False):
    torch.manual_seed(3)
    k_size = 64
    x = torch.randn(32, 2 * k_size if gated else k_size).to(dtype)
    weight = (torch.randn(48, k_size) / 8).to(dtype)
    kwargs = dict(bias=torch.randn(48).to(dtype) if bias else None,
                  norm=(torch.rand(k_size).to(dtype) + 0.5, 1e-6) if norm else None, gated=gated,
                  residual=torch.randn(32, 48).to(dtype) if residual else None)
    return x, weight, kwargs


@pytest.mark.parametrize("config", [Config(block_m=16, block_n=16, block_k=32),
                                    Config(block_m=16, block_n=16, block_k=16, splits=3)])
@pytest.mark.parametrize("fused", FUSED)
def test_fused_prologues_and_epilogue_match_the_reference(config, fused):
    """float32: the reference's arithmetic up to summation order; bf16 under the
    interpreter (which rounds toward zero) within a few roundings."""
    for dtype, tolerance in ((torch.float32, 1e-4), (torch.bfloat16, 0.1)):
        x, weight, kwargs = fused_inputs(dtype, **fused)
        got = row_linear(x, weight, kwargs.pop("bias"), **kwargs, config=config, force_triton=True)
        x, weight, kwargs = fused_inputs(dtype, **fused)
        expected = row_linear_ref(x, weight, kwargs.pop("bias"), kwargs["norm"], kwargs["gated"], kwargs["residual"])
        assert torch.allclose(got.float(), expected.float(), atol=tolerance, rtol=tolerance), (dtype, fused)


@pytest.mark.parametrize("fused", FUSED)
def test_fused_rows_depend_on_their_own_row_alone(fused):
    config = Config(block_m=16, block_n=16, block_k=16, splits=2)
    x, weight, kwargs = fused_inputs(torch.bfloat16, **fused)
    bias = kwargs.pop("bias")
    full = row_linear(x, weight, bias, **kwargs, config=config, force_triton=True)
    others = torch.randn_like(x)
    others[5] = x[5]
    moved = torch.roll(others, 9, dims=0)
    if kwargs["residual"] is not None:
        residual = torch.randn_like(kwargs["residual"])
        residual[14] = kwargs["residual"][5]
        kwargs["residual"] = residual
    assert torch.equal(row_linear(moved, weight, bias, **kwargs, config=config, force_triton=True)[14], full[5])


def test_configs_fit_shapes_by_halving_blocks():
    assert Config(block_m=64, block_n=128, block_k=256).fitted(64, 896, 4864) == Config(64, 128, 256)
    assert Config(block_m=64, block_n=128, block_k=128).fitted(16, 48, 96) == Config(16, 16, 32)
    assert Config().fitted(64, 100, 64) is None  # 100 outputs: no tile of 16 or more


def live_rows(rows: int, holding: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """A pass's (context, path_len) where only `holding` rows hold a token: some by
    context, some by path alone (a tree row off the main chain)."""
    context, path_len = torch.zeros(rows, dtype=torch.int64), torch.zeros(rows, dtype=torch.int64)
    for i, row in enumerate(holding):
        if i % 2:
            path_len[row] = 1 + i
        else:
            context[row] = 10 + i
    return context, path_len


@pytest.mark.parametrize("fused", FUSED + [dict()])
@pytest.mark.parametrize("config", [Config(block_m=16, block_n=16, block_k=16, splits=2),
                                    Config(block_m=16, block_n=16, block_k=32)])
def test_live_rows_have_the_bits_of_a_full_pass(fused, config):
    """Only the rows that hold a token computed (a step's one row of the bucket, a pass's
    first rows, rows scattered over blocks): theirs are the bits every row gets when all
    are computed, whatever the others hold; the block of rows 16-31 holds none."""
    x, weight, kwargs = fused_inputs(torch.bfloat16, **fused)
    bias = kwargs.pop("bias")
    full = row_linear(x, weight, bias, **kwargs, config=config, force_triton=True)
    for holding in ([0], [0, 1, 2, 3, 4], [3, 9, 14]):
        garbage = x.clone()
        dead = [r for r in range(32) if r not in holding]
        garbage[dead] = float("nan")  # never read: a NaN would reach the live rows through any sum
        got = row_linear(garbage, weight, bias, **kwargs, config=config, live=live_rows(32, holding),
                         force_triton=True)
        assert torch.equal(got[holding], full[holding]), holding


def test_padding_rows_are_not_computed():
    """A block of rows without a token is skipped by the product; with a split of K the
    reduce skips every such row."""
    x, weight, kwargs = fused_inputs(torch.float32, residual=True)
    untouched = torch.full((48,), 7.0)
    for config in (Config(block_m=16, block_n=16, block_k=16), Config(block_m=16, block_n=16, block_k=16, splits=2)):
        out = torch.full((32, 48), 7.0)
        row_linear(x, weight, **kwargs, config=config, live=live_rows(32, [2]), out=out, force_triton=True)
        assert all(torch.equal(out[r], untouched) for r in range(16, 32)), config  # no program for rows 16-31
        assert not torch.equal(out[2], untouched)
        assert torch.equal(out[3], untouched) == (config.splits > 1), config


def test_bad_live_rows_and_pdl_modes_are_refused():
    x, weight = torch.randn(16, 32), torch.randn(16, 32)
    config = Config(block_m=16, block_n=16, block_k=16)
    with pytest.raises(ValueError, match="live must be"):
        row_linear(x, weight, config=config, live=live_rows(8, [0]))
    with pytest.raises(ValueError, match="pdl 'early'"):
        row_linear(x, weight, config=config, pdl="early")


@pytest.mark.parametrize("fused", FUSED + [dict()])
def test_a_folded_split_has_the_reduce_kernels_bits_and_leaves_its_counts_zero(fused):
    """`counts`: the program that stores a block's last split adds the splits up, in split
    order, instead of a second launch; live rows or all, twice on one counts buffer."""
    x, weight, kwargs = fused_inputs(torch.bfloat16, **fused)
    bias = kwargs.pop("bias")
    config = Config(block_m=16, block_n=16, block_k=16, splits=4)  # K 64: four splits of one step
    counts = torch.zeros(64, dtype=torch.int32)
    for live in (None, live_rows(32, [0, 1, 2])):
        launched = row_linear(x, weight, bias, **kwargs, config=config, live=live, force_triton=True)
        for _ in range(2):
            folded = row_linear(x, weight, bias, **kwargs, config=config, live=live, counts=counts, force_triton=True)
            rows = slice(None) if live is None else slice(0, 3)
            assert torch.equal(folded[rows], launched[rows])
            assert not counts.any()


def test_counts_too_few_for_the_blocks_are_refused():
    x, weight = torch.randn(32, 32), torch.randn(48, 32)
    with pytest.raises(ValueError, match="counts must be"):
        row_linear(x, weight, config=Config(block_m=16, block_n=16, block_k=16, splits=2),
                   counts=torch.zeros(5, dtype=torch.int32))  # 3 x 2 blocks
