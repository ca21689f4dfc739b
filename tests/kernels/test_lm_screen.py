"""lm_head behind its int8 screen (kernels/lm_screen.py, CODESPEC_CUDA_LM_SCREEN) under the
interpreter: the screened product's choices are the full product's, bit for bit, on
random rows, rows with a clear winner, ties across blocks, NaNs, padding rows and row
groups; every row's choice lies in a block it flags; the kernels agree with their torch
references."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from codespec.kernels.lm_screen import ScreenWeights, flagged, head_rows, screen_bounds
from codespec.kernels.row_linear import Config, row_linear, row_linear_ref
from tests.kernels.interpreter_patch import PADDING_ROW_WARNINGS

pytest.importorskip("triton", reason="triton is a test dependency (pip install -e '.[test]')")
pytestmark = PADDING_ROW_WARNINGS

VOCAB, WIDTH, BLOCK = 256, 64, 16  # 16 blocks of 16 tokens
TILE = Config(16, BLOCK, 16, num_stages=2)


def weights(dtype: torch.dtype, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(VOCAB, WIDTH, generator=generator) / WIDTH ** 0.5).to(dtype)


def hidden(rows: int, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows of a residual stream, their partial sums of squares (4 parts, as down leaves
    them) and a norm weight."""
    generator = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, WIDTH, generator=generator) * 3).to(dtype)
    squares = x.float().pow(2).view(rows, 4, -1).sum(-1)
    norm = (1 + torch.rand(WIDTH, generator=generator)).to(dtype)
    return x, squares, norm


def screened_choices(x: torch.Tensor, squares: torch.Tensor, norm: torch.Tensor, weight: torch.Tensor,
                     live: tuple[torch.Tensor, torch.Tensor] | None = None, tile: Config = TILE,
                     screen_n: int = BLOCK, screen_group: int = 1):
    """The four launches (head_rows, screen_bounds over `screen_n` tokens a program, the
    screened product, its choices) through the Triton kernels, and the full product's
    choices over the same normed rows."""
    rows = x.shape[0]
    normed, norms, best = head_rows(x, squares, norm, 1e-6, live=live, force_triton=True)
    hi = screen_bounds(normed, norms, best, ScreenWeights.of(weight), block_m=tile.block_m, block_n=screen_n,
                       flag_n=tile.block_n, block_k=32, row_group=screen_group, live=live, force_triton=True)
    got = torch.empty(rows, dtype=torch.int64)
    screened = torch.full((rows, weight.shape[0]), float("nan"), dtype=x.dtype)
    row_linear(normed, weight, choices=got, config=tile, live=live, screened=(hi, best), out=screened,
               force_triton=True)
    full = torch.empty(rows, dtype=torch.int64)
    logits = row_linear(normed, weight, choices=full, config=tile, live=live, force_triton=True)
    return got, full, logits, flagged(hi, best, x.dtype), screened


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_screened_choices_are_the_full_products_on_random_and_peaked_rows(dtype):
    for seed in range(2):
        weight = weights(dtype, seed)
        x, squares, norm = hidden(32, dtype, 10 + seed)
        # rows 16..31 with a clear winner each (real rows are peaked): their normed rows
        # lie along one token's weights
        tokens = torch.arange(16) * 13 + seed
        x[16:] = (weight[tokens].float() / weight[tokens].float().norm(dim=1, keepdim=True) * 12).to(dtype)
        squares = x.float().pow(2).view(32, 4, -1).sum(-1)
        # the second seed's screen reads 64 tokens a program, flagging each 16 of them, for
        # both blocks of 16 rows (a row group)
        got, full, logits, flags, screened = screened_choices(x, squares, norm, weight, screen_n=16 * 4 ** seed,
                                                              screen_group=1 + seed)
        assert torch.equal(got, full), seed
        # a program computes a block of outputs where a row of its 16 flags it, the full
        # product's bits; the others compute nothing
        for first in (0, 16):
            computed = flags[first:first + 16].any(dim=0).repeat_interleave(BLOCK)
            block = screened[first:first + 16]
            assert torch.equal(block[:, computed], logits[first:first + 16, computed])
            assert bool(block[:, ~computed].isnan().all()) and not bool(computed.all())
        assert torch.equal(full, logits.argmax(dim=1))
        assert bool(flags[torch.arange(32), full // BLOCK].all())
        assert flags[16:].sum() < flags[:16].sum() and flags[16:].sum(dim=1).float().median() <= 2


def test_a_tie_across_blocks_takes_the_first_and_a_nan_row_its_nan():
    weight = weights(torch.bfloat16, 5)
    x, squares, norm = hidden(16, torch.bfloat16, 9)
    normed, _, _ = head_rows(x, squares, norm, 1e-6)
    # row 0's clear winner copied to token 40, an earlier block: the same logit, and
    # argmax's first index is the choice
    winner = (normed[0].float() / normed[0].float().norm() * 3).to(torch.bfloat16)
    weight[200], weight[40] = winner, winner
    x[1, 7] = float("nan")
    squares[1, 0] = float("nan")
    got, full, logits, flags, _ = screened_choices(x, squares, norm, weight)
    assert full[0] == 40 and got[0] == 40 and flags[0, 40 // BLOCK] and flags[0, 200 // BLOCK]
    assert bool(flags[1].all()) and torch.equal(got, full)


def test_padding_rows_and_row_groups_keep_the_live_rows_choices():
    """A pass of 20 live rows in a 64-row bucket: the screen and the product skip the
    padding rows; in groups of two blocks of 16 rows, each weight tile serves both; the
    screen's groups of four blocks compute the two that hold a token, or all four."""
    weight = weights(torch.bfloat16, 3)
    x, squares, norm = hidden(64, torch.bfloat16, 4)
    context = torch.tensor([9] * 20 + [0] * 44)
    live = (context, torch.zeros(64, dtype=torch.int64))
    for tile, screen_group in ((TILE, 1), (Config(16, BLOCK, 16, num_stages=2, row_group=2), 2), (TILE, 4)):
        got, full, _, _, _ = screened_choices(x, squares, norm, weight, live, tile, screen_group=screen_group)
        assert torch.equal(got[:20], full[:20]), tile
    got, full, _, _, _ = screened_choices(x, squares, norm, weight, None, TILE, screen_group=4)  # four live blocks
    assert torch.equal(got, full)


def test_the_kernels_are_their_references():
    weight = weights(torch.float32, 7)
    x, squares, norm = hidden(16, torch.float32, 8)
    screen = ScreenWeights.of(weight)
    expected = head_rows(x, squares, norm, 1e-6)
    got = head_rows(x, squares, norm, 1e-6, force_triton=True)
    for name, want, have in zip(("normed", "norms", "best"), expected, got):
        assert torch.allclose(want, have, rtol=1e-5), name
    hi_ref = screen_bounds(*expected, screen, block_m=16, block_n=BLOCK)
    hi = screen_bounds(*got, screen, block_m=16, block_n=BLOCK, block_k=32, force_triton=True)
    assert torch.allclose(hi_ref, hi, rtol=1e-4, atol=1e-4) and torch.allclose(expected[2], got[2], rtol=1e-4)
    # 32 rows in one group of two blocks: the bounds of each block alone
    wide = torch.cat([x, x.flip(0)]), torch.cat([squares, squares.flip(0)])
    rows = head_rows(*wide, norm, 1e-6, force_triton=True)
    grouped = screen_bounds(*rows, screen, block_m=16, block_n=BLOCK, block_k=32, row_group=2, force_triton=True)
    alone = screen_bounds(*head_rows(*wide, norm, 1e-6, force_triton=True), screen, block_m=16, block_n=BLOCK,
                          block_k=32, force_triton=True)
    assert torch.equal(grouped, alone) and torch.equal(grouped[:16], hi)
    # the bound holds: every logit between its token's lower and upper bound
    logits = expected[0].double() @ weight.double().T
    margin = screen.bound.double() * expected[1].double()[:, None]
    approx = (expected[0].double() @ screen.q.double().T) * screen.scale.double()
    assert bool(((logits - approx).abs() <= margin).all())


def test_bad_arguments_are_one_clear_line():
    weight = weights(torch.float32, 1)
    x, squares, norm = hidden(16, torch.float32, 2)
    normed, norms, best = head_rows(x, squares, norm, 1e-6)
    hi = screen_bounds(normed, norms, best, ScreenWeights.of(weight), block_m=16, block_n=BLOCK)
    choices = torch.empty(16, dtype=torch.int64)
    with pytest.raises(ValueError, match="screened goes with choices, no bias and one split"):
        row_linear(normed, weight, torch.zeros(VOCAB), choices=choices, config=TILE, screened=(hi, best))
    with pytest.raises(ValueError, match="do not tile"):
        screen_bounds(normed, norms, best, ScreenWeights.of(weight), block_m=16, block_n=24)
    with pytest.raises(ValueError, match="sums of up to 4096 terms"):
        ScreenWeights.of(torch.zeros(16, 8192))


@pytest.mark.slow
@pytest.mark.model
def test_on_the_default_models_real_rows_the_screened_choices_are_the_full_products(default_model):
    """The real weights in bf16 (lm_head: the tied embeddings) and the residual stream of
    real code before the final norm: the four launches, as the fused layers run them
    (norm weights, 128-token screen programs flagging each 32), give every row the full
    product's choice, computing a few of the 4,748 blocks of 32 a row."""
    from pathlib import Path

    from codespec.forward.cuda_fused import SCREEN_BLOCK_N, SCREENED_LM_HEAD
    from codespec.kernels import lm_screen

    model, tokenizer = default_model.model, default_model.tokenizer
    body = model.model
    weight = model.get_input_embeddings().weight.detach().to(torch.bfloat16)  # tied: lm_head
    norm = body.norm.weight.detach().to(torch.bfloat16)
    seen = []
    handle = body.norm.register_forward_hook(lambda module, args, output: seen.append(args[0][0]))
    with torch.no_grad():
        for text in (Path(__file__).read_text()[:1500], Path(lm_screen.__file__).read_text()[:1500]):
            model(torch.tensor([tokenizer.encode(text)[:200]]))
    handle.remove()
    x = torch.cat([hidden[torch.linspace(20, hidden.shape[0] - 1, 8).long()] for hidden in seen])
    x = x.to(torch.bfloat16).contiguous()
    squares = x.float().pow(2).view(16, 28, -1).sum(-1)  # as down leaves them: 28 blocks of 32
    tile = replace(SCREENED_LM_HEAD, block_m=16)
    normed, norms, best = head_rows(x, squares, norm, body.norm.variance_epsilon, force_triton=True)
    hi = screen_bounds(normed, norms, best, ScreenWeights.of(weight), block_m=16, block_n=SCREEN_BLOCK_N,
                       flag_n=tile.block_n, force_triton=True)
    got = torch.empty(16, dtype=torch.int64)
    row_linear(normed, weight, choices=got, config=tile, screened=(hi, best), force_triton=True)
    # the full product's choices by its torch reference (float32 sums in another order:
    # the interpreter's full product of 4,748 programs would take minutes; these rows'
    # winners stand clear of rounding)
    full = row_linear_ref(normed, weight, None)
    flags = flagged(hi, best, torch.bfloat16)
    assert torch.equal(got, full.argmax(dim=1))
    assert flags.shape == (16, 4748) and flags.sum(dim=1).float().median() <= 16, flags.sum(dim=1)
