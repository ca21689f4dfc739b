"""The lm_head screen probe (`lmscreen` stage, 2026-11-27): would greedy choices through an
int8 copy of lm_head save what its bytes promise on the GPU, and how many vocab blocks
would the exact product still have to compute?

lm_head is the step's largest product (2026-11-27: 133 us of ~1.2 ms on the H100, its
bf16 bytes 91 us). A greedy row needs its argmax alone. The CPU path already finds it
through an int8 screen (kernels/lmchoice.py). The GPU design (docs/gpu.md, "Open")
screens every vocab block in int8, flags the blocks that may hold the row's
choice, and recomputes those with lm_head's own row_linear tile, so every choice keeps
the bits it has without the screen. This probe prices the first half: the screen kernel
against the bf16 product at one row and at 32, and the blocks it flags.

The screen itself is kernels/lm_screen.py's (its bound in that module's docstring), which
the fused layers now run behind CODESPEC_CUDA_LM_SCREEN (2026-11-28); here it screens
rows whose norms the host computes in float64.
"""

from __future__ import annotations

from typing import Any

import torch

from codespec.kernels.lm_screen import ScreenWeights, flagged, screen_bounds
from codespec.kernels.row_linear import Config, row_linear


class Screen:
    """lm_head `weight` [vocab, K] in int8 with a scale and a bound per token
    (kernels/lm_screen.ScreenWeights), screened in blocks of `block_n` tokens."""

    def __init__(self, weight: torch.Tensor, block_n: int = 128, block_k: int = 128) -> None:
        self.weights = ScreenWeights.of(weight)
        self.q = self.weights.q
        self.block_n, self.block_k, self.dtype = block_n, block_k, weight.dtype

    @property
    def blocks(self) -> int:
        return self.q.shape[0] // self.block_n

    def bounds(self, x: torch.Tensor, block_m: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's largest upper bound per vocab block, float32 [rows, blocks], and its
        best lower bound, float32 [rows]."""
        # ||x|| in float64, rounded up past float32's rounding of it
        norm = (x.double().norm(dim=1) * (1 + 2.0 ** -20)).float()
        best = torch.full((x.shape[0],), float("-inf"), dtype=torch.float32, device=x.device)
        hi = screen_bounds(x, norm, best, self.weights, block_m=block_m, block_n=self.block_n, block_k=self.block_k,
                           force_triton=True)
        return hi, best

    def flagged(self, hi: torch.Tensor, best: torch.Tensor) -> torch.Tensor:
        """bool [rows, blocks]: the blocks that may hold each row's greedy choice."""
        return flagged(hi, best, self.dtype)


def check(screen: Screen, weight: torch.Tensor, x: torch.Tensor, tile: Config) -> dict[str, Any]:
    """The screen's flags against lm_head's own choices (row_linear's tile): every row's
    choice in a flagged block of its own, and how many blocks each row flags."""
    rows = x.shape[0]
    choices = torch.empty(rows, dtype=torch.int64, device=x.device)
    row_linear(x, weight, choices=choices, config=tile)
    flags = screen.flagged(*screen.bounds(x))
    held = flags[torch.arange(rows, device=x.device), choices // screen.block_n]
    per_row = flags.sum(dim=1).float()
    return {"rows": rows, "choices_covered": int(held.sum()), "blocks": screen.blocks,
            "flagged_per_row_median": float(per_row.median()), "flagged_per_row_max": int(per_row.max()),
            "flagged_any_row": int(flags.any(dim=0).sum())}


def lmscreen_probe(loaded: Any) -> dict[str, Any]:
    """On CUDA, the loaded model's lm_head: the screen's flags on random rows scaled like a
    normed hidden state (and on rows with a clear winner), and the screen's device us
    against the bf16 product's at 1 and 32 rows (16-row programs, as the fused layers)."""
    from gpu_measure import _graph_us, hbm_copy_gbs

    weight = loaded.model.lm_head.weight.detach()
    vocab, width = weight.shape
    screen = Screen(weight)
    generator = torch.Generator(device=weight.device).manual_seed(7)
    tile = Config(16, 128, 64)
    result: dict[str, Any] = {"vocab": vocab, "width": width, "bf16_mb": round(weight.numel() * 2 / 1e6, 1),
                              "int8_mb": round(screen.q.numel() / 1e6, 1)}
    gbs = hbm_copy_gbs()
    result["floor_us"] = {"bf16": round(weight.numel() * 2 / (gbs * 1e3), 1),
                          "int8": round(screen.q.numel() / (gbs * 1e3), 1)}
    for rows in (16, 32):
        x = torch.randn(rows, width, generator=generator, device=weight.device).to(weight.dtype)
        result[f"random_{rows}"] = check(screen, weight, x, tile)
        # a clear winner per row: x along one token's weights (real models' rows are peaked)
        tokens = torch.randint(0, vocab, (rows,), generator=generator, device=weight.device)
        peaked = (x.float() + 4 * weight[tokens].float() / weight[tokens].float().norm(dim=1, keepdim=True)
                  * width ** 0.5).to(weight.dtype)
        result[f"peaked_{rows}"] = check(screen, weight, peaked, tile)
        choices = torch.empty(rows, dtype=torch.int64, device=weight.device)
        result[f"us_{rows}"] = {
            "bf16_choices": _graph_us(lambda x=x, choices=choices: row_linear(x, weight, choices=choices, config=tile)),
            "int8_screen": _graph_us(lambda x=x: screen.bounds(x))}
    return result
