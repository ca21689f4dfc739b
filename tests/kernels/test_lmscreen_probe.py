"""The lm_head screen probe (scripts/gpu_lmscreen.py) under the interpreter: every row's
greedy choice lies in a block the screen flags for that row, whatever the row (ties
across blocks, a NaN, float32 or bfloat16), and a row with a clear winner flags few
blocks. The timings wait for the `lmscreen` stage on a GPU."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton", reason="triton is a test dependency (pip install -e '.[test]')")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
gpu_lmscreen = pytest.importorskip("gpu_lmscreen")

from codespec.kernels.row_linear import Config  # noqa: E402

VOCAB, WIDTH, BLOCK = 256, 64, 16  # 16 blocks of 16 tokens
TILE = Config(16, BLOCK, 16)


def weights(dtype: torch.dtype, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(VOCAB, WIDTH, generator=generator) / WIDTH ** 0.5).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_rows_choice_is_in_a_block_it_flags(dtype):
    for seed in range(3):
        weight = weights(dtype, seed)
        screen = gpu_lmscreen.Screen(weight, block_n=BLOCK, block_k=16)
        x = torch.randn(32, WIDTH, generator=torch.Generator().manual_seed(100 + seed)).to(dtype)
        seen = gpu_lmscreen.check(screen, weight, x, TILE)
        assert seen["choices_covered"] == 32, seen
        assert seen["flagged_per_row_median"] < screen.blocks, seen  # the screen rules blocks out


def test_a_tie_across_blocks_flags_the_first_and_a_nan_flags_every_block():
    weight = weights(torch.bfloat16, 5)
    x = torch.randn(16, WIDTH, generator=torch.Generator().manual_seed(9)).to(torch.bfloat16)
    # row 0's clear winner, token 200, copied to token 40: the same logit, and argmax's
    # first index (40, an earlier block) is the choice
    winner = (x[0].float() / x[0].float().norm() * 3).to(torch.bfloat16)
    weight[200], weight[40] = winner, winner
    x[1, 7] = float("nan")
    screen = gpu_lmscreen.Screen(weight, block_n=BLOCK, block_k=16)
    flags = screen.flagged(*screen.bounds(x))
    assert flags[0, 40 // BLOCK] and flags[0, 200 // BLOCK]
    assert bool(flags[1].all())
    assert gpu_lmscreen.check(screen, weight, x, TILE)["choices_covered"] == 16


def test_a_row_with_a_clear_winner_flags_its_block_alone():
    weight = weights(torch.bfloat16, 2)
    screen = gpu_lmscreen.Screen(weight, block_n=BLOCK, block_k=16)
    tokens = torch.arange(16) * 13 + 5
    x = (weight[tokens].float() / weight[tokens].float().norm(dim=1, keepdim=True) * 4 * WIDTH ** 0.5
         ).to(torch.bfloat16)
    flags = screen.flagged(*screen.bounds(x))
    assert flags.sum(dim=1).tolist() == [1] * 16
    assert flags[torch.arange(16), tokens // BLOCK].all()


def test_the_stage_reports_coverage_flags_and_both_timings(monkeypatch):
    """lmscreen_probe on CPU over a tiny model's lm_head, the device timings stubbed (the
    GPU's alone): random and peaked rows at 16 and 32 rows, every choice covered."""
    import types

    import gpu_measure

    from codespec.models.tiny import tiny_model

    ran = []
    monkeypatch.setattr(gpu_measure, "_graph_us", lambda run, calls=20: ran.append(run()) or 1.0)
    monkeypatch.setattr(gpu_measure, "hbm_copy_gbs", lambda: 3000.0)
    model = tiny_model("qwen2", vocab_size=256, seed=4, dtype=torch.bfloat16)
    result = gpu_lmscreen.lmscreen_probe(types.SimpleNamespace(model=model))
    for rows in (16, 32):
        for kind in ("random", "peaked"):
            assert result[f"{kind}_{rows}"]["choices_covered"] == rows, result
        assert result[f"us_{rows}"] == {"bf16_choices": 1.0, "int8_screen": 1.0}
    assert result["peaked_32"]["flagged_per_row_median"] <= result["random_32"]["flagged_per_row_median"]
    assert len(ran) == 4  # both kernels at both row counts ran
    assert result["int8_mb"] * 2 == pytest.approx(result["bf16_mb"], rel=0.01)


@pytest.mark.slow
@pytest.mark.model
def test_on_the_default_models_lm_head_real_rows_flag_a_few_blocks_of_1187(default_model):
    """The real weights (lm_head is the tied embeddings) and real final hidden states of
    code: every choice covered, and a row flags a few of the 1,187 blocks (
    64 rows: median 2, at most 13), so the exact product would recompute ~0.2% of
    lm_head for a step."""
    model, tokenizer = default_model.model, default_model.tokenizer
    weight = model.get_input_embeddings().weight.detach()
    screen = gpu_lmscreen.Screen(weight)
    texts = [Path(gpu_lmscreen.__file__).read_text()[:2000], Path(__file__).read_text()[:2000]]
    rows = []
    with torch.no_grad():
        for text in texts:
            ids = torch.tensor([tokenizer.encode(text)[:300]])
            hidden = model.model(ids).last_hidden_state[0]  # after the final norm: lm_head's input
            rows.append(hidden[torch.linspace(30, hidden.shape[0] - 1, 8).long()])
    x = torch.cat(rows).to(weight.dtype).contiguous()
    seen = gpu_lmscreen.check(screen, weight, x, Config(16, 128, 64))
    assert seen["blocks"] == 1187 and seen["choices_covered"] == 16, seen
    assert seen["flagged_per_row_median"] <= 8 and seen["flagged_any_row"] <= 100, seen
