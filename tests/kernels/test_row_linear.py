"""The row-exact product (kernels/row_linear.py) under the Triton interpreter: equal to
its reference, and a row's bits depend on its own input row alone."""

from __future__ import annotations

import pytest
import torch

from codespec.kernels.row_linear import (Config, Rope, block_squares, embed_squares, gate_up_pairs, row_linear,
                                         row_linear_ref)
from tests.covering import covering

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


FUSED = [dict(norm=True), dict(pairs=True), dict(residual=True), dict(norm=True, residual=True),
         dict(norm=True, squares=True), dict(residual=True, squares_out=True, bias=True),
         dict(norm=True, squares=True, pairs=True)]


def fused_inputs(dtype, norm=False, squares=False, pairs=False, residual=False, squares_out=False, bias=False,
                 block_n=16):
    torch.manual_seed(3)
    k_size = 64
    x = torch.randn(32, k_size).to(dtype)
    weight = (torch.randn(48, k_size) / 8).to(dtype)
    kwargs = dict(bias=torch.randn(48).to(dtype) if bias else None,
                  norm=(torch.rand(k_size).to(dtype) + 0.5, 1e-6) if norm else None,
                  squares=block_squares(x, 4) if squares else None, pairs=pairs,
                  residual=torch.randn(32, 48).to(dtype) if residual else None,
                  squares_out=torch.zeros(32, 48 // block_n) if squares_out else None)
    return x, weight, kwargs


def product(x, weight, kwargs, **launch):
    """row_linear under the interpreter; the squares in follow x (a product wrote them for it)."""
    kwargs = dict(kwargs)
    if kwargs["squares"] is not None:
        kwargs["squares"] = block_squares(x, kwargs["squares"].shape[1])
    if kwargs["squares_out"] is not None:
        kwargs["squares_out"] = torch.zeros_like(kwargs["squares_out"])
    out = row_linear(x, weight, kwargs.pop("bias"), **kwargs, **launch, force_triton=True)
    return out, kwargs["squares_out"]


@pytest.mark.parametrize("fused,config", covering(FUSED, [Config(block_m=16, block_n=16, block_k=32),
                                                           Config(block_m=16, block_n=16, block_k=16, splits=3)]))
def test_fused_prologues_and_epilogues_match_the_reference(config, fused):
    """float32: the reference's arithmetic up to summation order; bf16 under the
    interpreter (which rounds toward zero) within a few roundings. The sums of squares
    written are those of the stored output, block by block."""
    for dtype, tolerance in ((torch.float32, 1e-4), (torch.bfloat16, 0.1)):
        x, weight, kwargs = fused_inputs(dtype, **fused)
        got, squares = product(x, weight, kwargs, config=config)
        expected = row_linear_ref(x, weight, kwargs["bias"], kwargs["norm"], kwargs["pairs"], kwargs["residual"])
        assert got.shape == expected.shape
        assert torch.allclose(got.float(), expected.float(), atol=tolerance, rtol=tolerance), (dtype, fused)
        if squares is not None:
            assert torch.allclose(squares, block_squares(got, squares.shape[1]), rtol=1e-5), dtype


def test_a_norm_from_squares_is_the_walks_up_to_summation_order():
    """The norm's scale from a product's sums of squares, or walking x: the same values
    but for the order of the sum (float32: within its rounding)."""
    x, weight, kwargs = fused_inputs(torch.float32, norm=True)
    walked, _ = product(x, weight, kwargs, config=Config(block_m=16, block_n=16, block_k=16))
    kwargs["squares"] = block_squares(x, 4)
    summed, _ = product(x, weight, kwargs, config=Config(block_m=16, block_n=16, block_k=16))
    assert torch.allclose(summed, walked, rtol=1e-5, atol=1e-6)


def test_pairs_are_silu_gate_times_up_of_the_stacked_product():
    """gate_up_pairs interleaves the rows; the epilogue's SiLU(gate) * up is the stacked
    product's, as the default layers compute it (bf16: the same roundings)."""
    torch.manual_seed(4)
    x = torch.randn(16, 32).to(torch.bfloat16)
    gate, up = (torch.randn(24, 32) / 4).to(torch.bfloat16), (torch.randn(24, 32) / 4).to(torch.bfloat16)
    stacked = row_linear_ref(x, torch.cat([gate, up]), None)
    expected = torch.nn.functional.silu(stacked[:, :24]) * stacked[:, 24:]
    pairs = gate_up_pairs(gate, up)
    assert torch.equal(pairs[0::2], gate) and torch.equal(pairs[1::2], up)
    config = Config(block_m=16, block_n=16, block_k=16)
    assert torch.equal(row_linear(x, pairs, pairs=True, config=config), expected)  # the reference (CPU tensors)
    got = row_linear(x, pairs, pairs=True, config=config, force_triton=True)
    assert torch.allclose(got.float(), expected.float(), atol=0.05, rtol=0.05)


@pytest.mark.parametrize("fused", FUSED)
def test_fused_rows_depend_on_their_own_row_alone(fused):
    config = Config(block_m=16, block_n=16, block_k=16, splits=2)
    x, weight, kwargs = fused_inputs(torch.bfloat16, **fused)
    full, full_squares = product(x, weight, kwargs, config=config)
    others = torch.randn_like(x)
    others[5] = x[5]
    moved = torch.roll(others, 9, dims=0)
    if kwargs["residual"] is not None:
        residual = torch.randn_like(kwargs["residual"])
        residual[14] = kwargs["residual"][5]
        kwargs["residual"] = residual
    got, squares = product(moved, weight, kwargs, config=config)
    assert torch.equal(got[14], full[5])
    if squares is not None:
        assert torch.equal(squares[14], full_squares[5])


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


@pytest.mark.parametrize("fused,config", covering(FUSED + [dict()],
                                                  [Config(block_m=16, block_n=16, block_k=16, splits=2),
                                                   Config(block_m=16, block_n=16, block_k=32)]))
def test_live_rows_have_the_bits_of_a_full_pass(fused, config):
    """Only the rows that hold a token computed (a step's one row of the bucket, a pass's
    first rows, rows scattered over blocks): theirs are the bits every row gets when all
    are computed, whatever the others hold; the block of rows 16-31 holds none."""
    x, weight, kwargs = fused_inputs(torch.bfloat16, **fused)
    full, full_squares = product(x, weight, kwargs, config=config)
    for holding in ([0], [0, 1, 2, 3, 4], [3, 9, 14]):
        garbage = x.clone()
        dead = [r for r in range(32) if r not in holding]
        garbage[dead] = float("nan")  # never read: a NaN would reach the live rows through any sum
        got, squares = product(garbage, weight, kwargs, config=config, live=live_rows(32, holding))
        assert torch.equal(got[holding], full[holding]), holding
        if squares is not None:
            assert torch.equal(squares[holding], full_squares[holding]), holding


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
    config = Config(block_m=16, block_n=16, block_k=16, splits=4)  # K 64: four splits of one step
    counts = torch.zeros(64, dtype=torch.int32)
    for live in (None, live_rows(32, [0, 1, 2])):
        launched, launched_squares = product(x, weight, kwargs, config=config, live=live)
        for _ in range(2):
            folded, squares = product(x, weight, kwargs, config=config, live=live, counts=counts)
            rows = slice(None) if live is None else slice(0, 3)
            assert torch.equal(folded[rows], launched[rows])
            if squares is not None:
                assert torch.equal(squares[rows], launched_squares[rows])
            assert not counts.any()


def test_squares_and_pairs_out_of_place_are_refused():
    x, weight = torch.randn(16, 32), torch.randn(32, 32)
    config = Config(block_m=16, block_n=16, block_k=16)
    norm = (torch.ones(32), 1e-6)
    with pytest.raises(ValueError, match="squares go with a norm"):
        row_linear(x, weight, squares=torch.zeros(16, 2), config=config)
    with pytest.raises(ValueError, match="squares go with a norm"):
        row_linear(x, weight, norm=norm, squares=torch.zeros(16, 3), config=config)  # 3 does not divide K 32
    with pytest.raises(ValueError, match="pairs"):
        row_linear(x, weight, pairs=True, residual=torch.zeros(16, 32), config=config)
    with pytest.raises(ValueError, match=r"squares_out must be float32 \[rows, 2\]"):
        row_linear(x, weight, squares_out=torch.zeros(16, 4), config=config)


def test_counts_too_few_for_the_blocks_are_refused():
    x, weight = torch.randn(32, 32), torch.randn(48, 32)
    with pytest.raises(ValueError, match="counts must be"):
        row_linear(x, weight, config=Config(block_m=16, block_n=16, block_k=16, splits=2),
                   counts=torch.zeros(5, dtype=torch.int32))  # 3 x 2 blocks


def rope_case(dtype, block_n):
    """q/k/v outputs of 4 query and 2 KV heads of 16, rows 12-15 padding (their source row
    0), rotary tables of 32 positions, a cache of 2 slots."""
    torch.manual_seed(6)
    heads, kv_heads, dim, rows = 4, 2, 16, 16
    x = torch.randn(rows, 64).to(dtype)
    weight = (torch.randn((heads + 2 * kv_heads) * dim, 64) / 8).to(dtype)
    bias = torch.randn(weight.shape[0]).to(dtype)
    angles = torch.randn(32, dim)
    context = torch.tensor([9] * 6 + [0] * 10)
    path_len = torch.tensor([0] * 6 + [3] * 6 + [0] * 4)  # rows 6-11 by their paths alone
    positions = torch.tensor([9, 10, 11, 12, 13, 14] + [12, 13, 14, 12, 13, 14] + [9] * 4)

    def rope(keys, values):
        return Rope(cos=angles.cos().to(dtype), sin=angles.sin().to(dtype), positions=positions,
                    source=torch.tensor(list(range(12)) + [0] * 4), write_slots=torch.tensor([0] * 6 + [1] * 6 + [0] * 4),
                    write_positions=positions, keys=keys, values=values, heads=heads, kv_heads=kv_heads)

    config = Config(block_m=16, block_n=block_n, block_k=16)
    return x, weight, bias, rope, (context, path_len), config


def empty_cache(dtype):
    return torch.zeros(2, 2, 32, 16, dtype=dtype), torch.zeros(2, 2, 32, 16, dtype=dtype)


@pytest.mark.parametrize("block_n,splits,fold,group,dtype", covering(
    [(16, 1, False, 1), (32, 1, False, 1), (16, 2, False, 1), (32, 4, True, 1), (32, 4, True, 2)],
    [torch.float32, torch.bfloat16], spread=[0]))
def test_rope_in_the_epilogue_has_rope_stores_bits(dtype, block_n, splits, fold, group):
    """q/k/v's epilogue rotates q and k and stores K and V as the product then rope_store
    do (kernels/rope_store.py), bit for bit, split or not, in a row group of blocks of 8
    or not (blocks of 8 rows there: the interpreter's dot takes them); padding rows store
    nothing."""
    x, weight, bias, rope, live, config = rope_case(dtype, block_n)
    config = Config(block_m=16 // group, block_n=block_n, block_k=16, splits=splits, row_group=group)
    counts = torch.zeros(64, dtype=torch.int32) if fold else None
    fused_cache, apart_cache = empty_cache(dtype), empty_cache(dtype)
    q = row_linear(x, weight, bias, rope=rope(*fused_cache), config=config, live=live, counts=counts,
                   force_triton=True)
    qkv = row_linear(x, weight, bias, config=config, live=live, force_triton=True)
    from codespec.kernels.rope_store import rope_store

    apart = rope(*apart_cache)
    expected = rope_store(qkv, apart.cos, apart.sin, apart.source, apart.write_slots, apart.write_positions,
                          *apart_cache, heads=4, kv_heads=2, positions=apart.positions, live=live, force_triton=True)
    assert torch.equal(q.view(16, 4, 16)[:12], expected[:12])
    assert torch.equal(fused_cache[0], apart_cache[0]) and torch.equal(fused_cache[1], apart_cache[1])
    assert fused_cache[0][1].count_nonzero() > 0 and fused_cache[0][0, :, 9].count_nonzero() > 0


def test_rope_in_the_epilogue_through_the_reference_is_rope_stores():
    x, weight, bias, rope, live, config = rope_case(torch.float32, 32)
    got_cache, expected_cache = empty_cache(torch.float32), empty_cache(torch.float32)
    q = row_linear(x, weight, bias, rope=rope(*got_cache), config=config, live=live)
    from codespec.kernels.rope_store import rope_store

    apart = rope(*expected_cache)
    expected = rope_store(row_linear_ref(x, weight, bias), apart.cos, apart.sin, apart.source, apart.write_slots,
                          apart.write_positions, *expected_cache, heads=4, kv_heads=2, positions=apart.positions)
    assert torch.equal(q.view(16, 4, 16), expected)
    assert torch.equal(got_cache[0], expected_cache[0]) and torch.equal(got_cache[1], expected_cache[1])


def test_rope_in_the_epilogue_needs_whole_heads_and_live_rows():
    x, weight, bias, rope, live, config = rope_case(torch.float32, 16)
    cache = empty_cache(torch.float32)
    with pytest.raises(ValueError, match="whole heads"):
        row_linear(x, weight, bias, rope=rope(*cache), config=Config(block_m=16, block_n=64, block_k=16), live=live)
    with pytest.raises(ValueError, match="rope needs live rows"):
        row_linear(x, weight, bias, rope=rope(*cache), config=config)


@pytest.mark.parametrize("split,tied", covering([dict(), dict(splits=2), dict(splits=4, fold=True),
                                                  dict(splits=4, fold=True, group=2)], [(5, 40), (20, 21)]))
def test_choices_are_the_first_maximum_of_the_stored_rows(split, tied):
    """lm_head's greedy choices from its epilogue: each row's first maximum of the stored
    (rounded) output, torch.argmax's, with a tie across blocks or inside one, split or
    not; through the kernel and the reference."""
    torch.manual_seed(8)
    x = (torch.rand(32, 64) + 0.1).to(torch.bfloat16)  # positive rows
    weight = (torch.randn(64, 64) / 8).to(torch.bfloat16)
    weight[list(tied)] = 1.0  # two equal outputs, the largest of every row
    config = Config(block_m=16, block_n=16, block_k=16, splits=split.get("splits", 1), row_group=split.get("group", 1))
    counts = torch.zeros(64, dtype=torch.int32) if split.get("fold") else None
    for force in (True, False):
        choices = torch.full((32,), -1, dtype=torch.int64)
        out = row_linear(x, weight, choices=choices, config=config, counts=counts, force_triton=force)
        assert torch.equal(choices, torch.argmax(out, dim=-1)) and set(choices.tolist()) == {tied[0]}, force
    random_weight = (torch.randn(64, 64) / 8).to(torch.bfloat16)
    choices = torch.zeros(32, dtype=torch.int64)
    out = row_linear(x, random_weight, choices=choices, config=config, counts=counts, force_triton=True)
    assert torch.equal(choices, torch.argmax(out, dim=-1))


@pytest.mark.parametrize("splits", [1, 2])
def test_choices_of_live_rows_whatever_the_padding_rows_hold(monkeypatch, splits):
    """A step's choices with rows that hold no token: padding rows of a computed block
    whose inputs are NaN, and a block of rows never computed whose maxima are whatever
    torch.empty left (NaN here, as uninitialized memory can hold). The live rows' choices
    are torch.argmax's; the rest are some index of the vocabulary, and nothing raises."""
    from codespec.kernels import _triton_linear

    def empty_nan(*shape, dtype=None, **kwargs):  # uninitialized memory at its worst
        return torch.full(shape, float("nan") if dtype.is_floating_point else -(2 ** 30), dtype=dtype, **kwargs)

    monkeypatch.setattr(_triton_linear.torch, "empty", empty_nan)
    torch.manual_seed(9)
    x = torch.randn(32, 64).to(torch.bfloat16)
    weight = (torch.randn(64, 64) / 8).to(torch.bfloat16)
    holding = [0, 1, 2]
    garbage = x.clone()
    garbage[3:] = float("nan")
    choices = torch.full((32,), -1, dtype=torch.int64)
    config = Config(block_m=16, block_n=16, block_k=16, splits=splits)
    row_linear(garbage, weight, choices=choices, config=config, live=live_rows(32, holding), force_triton=True)
    assert torch.equal(choices[holding], torch.argmax(row_linear_ref(x, weight, None)[holding], dim=-1))
    assert all(0 <= c < 64 for c in choices.tolist())


def test_choices_are_refused_where_nothing_is_stored_as_computed():
    x, weight = torch.randn(16, 32), torch.randn(32, 32)
    with pytest.raises(ValueError, match="choices must be int64"):
        row_linear(x, weight, choices=torch.zeros(16, dtype=torch.int32), config=Config(16, 16, 16))
    with pytest.raises(ValueError, match="choices must be int64"):
        row_linear(x, weight, pairs=True, choices=torch.zeros(16, dtype=torch.int64), config=Config(16, 16, 16))


def test_the_embeddings_come_with_their_sums_of_squares():
    """The fused layers' first norm: the gathered rows exactly, their sums of squares per
    block as a product's epilogue leaves them; a width that blocks of a power of two do
    not cut is refused."""
    torch.manual_seed(5)
    table = torch.randn(40, 96).to(torch.bfloat16)
    ids = torch.tensor([3, 39, 0, 3, 17])
    hidden, squares = embed_squares(ids, table, 3, force_triton=True)
    assert torch.equal(hidden, table[ids])
    assert torch.allclose(squares, block_squares(table[ids], 3), rtol=1e-5)
    assert torch.equal(squares[0], squares[3])
    reference = embed_squares(ids, table, 3)
    assert torch.equal(reference[0], hidden) and torch.allclose(reference[1], squares, rtol=1e-5)
    with pytest.raises(ValueError, match="power of two"):
        embed_squares(ids, table, 4)  # parts of 24


@pytest.mark.parametrize("fused,splits,fold", covering(FUSED + [dict()], [(1, False), (2, False), (4, True)],
                                                       spread=[1]))
def test_a_row_group_computes_each_block_as_a_group_of_one(fused, splits, fold):
    """Config.row_group: a program computes two blocks of 16 rows with each weight tile it
    loads, each block its own dot; every row that holds a token gets the bits one block a
    program gives it (all rows, a step's one row, a pass's first 20), and its sums of
    squares too; the split's sum folded or launched."""
    from dataclasses import replace

    x, weight, kwargs = fused_inputs(torch.bfloat16, **fused)
    one = Config(block_m=16, block_n=16, block_k=16, splits=splits)
    for holding in (None, [0], list(range(20))):
        live = None if holding is None else live_rows(32, holding)
        results = []
        for config in (one, replace(one, row_group=2)):
            counts = torch.zeros(64, dtype=torch.int32) if fold else None
            results.append(product(x, weight, kwargs, config=config, live=live, counts=counts))
            assert counts is None or not counts.any()
        (expected, expected_squares), (got, squares) = results
        rows = slice(None) if holding is None else holding
        assert torch.equal(got[rows], expected[rows]), holding
        if squares is not None:
            assert torch.equal(squares[rows], expected_squares[rows]), holding


def test_a_row_group_must_be_one_two_or_four_blocks_and_tile_the_rows():
    x, weight = torch.randn(32, 32), torch.randn(16, 32)
    with pytest.raises(ValueError, match="row group of 1, 2 or 4"):
        row_linear(x, weight, config=Config(block_m=16, block_n=16, block_k=16, row_group=3))
    with pytest.raises(ValueError, match="does not tile rows 32"):
        row_linear(x, weight, config=Config(block_m=16, block_n=16, block_k=16, row_group=4))
    assert Config(block_m=16, row_group=4).fitted(32, 16, 32).row_group == 2  # halved to fit the bucket


@pytest.mark.parametrize("fused,splits,group", covering(FUSED + [dict()], [(1, 1), (4, 1), (2, 2)], spread=[1]))
def test_live_rows_read_before_the_wait_give_the_same_bits(fused, splits, group):
    """`early_rows` (CODESPEC_CUDA_EARLY_ROWS): which rows hold a token is read
    before the wait, past L1, not after it. Every row that holds one gets the bits it gets
    without (a step's one row, a pass's first 20, rows scattered over both blocks), its sums
    of squares too, folded split or not, in a row group or not; and the rope epilogue's
    q, K and V (the reference path has no wait: the flag changes nothing there)."""
    x, weight, kwargs = fused_inputs(torch.bfloat16, **fused)
    config = Config(block_m=16 // group, block_n=16, block_k=16, splits=splits, row_group=group)
    for holding in ([0], list(range(20)), [3, 17, 30]):
        results = []
        for early in (False, True):
            counts = torch.zeros(64, dtype=torch.int32) if splits > 1 else None
            results.append(product(x, weight, kwargs, config=config, live=live_rows(32, holding), counts=counts,
                                   early_rows=early))
            assert counts is None or not counts.any()
        (expected, expected_squares), (got, squares) = results
        assert torch.equal(got[holding], expected[holding]), holding
        if squares is not None:
            assert torch.equal(squares[holding], expected_squares[holding]), holding
    x, weight, bias, rope, live, config = rope_case(torch.bfloat16, 32)
    caches = [empty_cache(torch.bfloat16) for _ in range(2)]
    q = [row_linear(x, weight, bias, rope=rope(*cache), config=config, live=live, early_rows=early, force_triton=True)
         for cache, early in zip(caches, (False, True))]
    assert torch.equal(q[0][:12], q[1][:12])
    assert all(torch.equal(a, b) for a, b in zip(*caches))
