"""The lm_head screen probe (`lmscreen` stage, session 34): would greedy choices through an
int8 copy of lm_head save what its bytes promise on the GPU, and how many vocab blocks
would the exact product still have to compute?

lm_head is the step's largest product (session 32: 133 us of ~1.2 ms on the H100, its
bf16 bytes 91 us). A greedy row needs its argmax alone. The CPU path already finds it
through an int8 screen (kernels/lmchoice.py). The GPU design (docs/benchmarks.md, "Next
GPU run") screens every vocab block in int8, flags the blocks that may hold the row's
choice, and recomputes those with lm_head's own row_linear tile, so every choice keeps
the bits it has without the screen. This probe prices the first half: the screen kernel
against the bf16 product at one row and at 32, and the blocks it flags.

The bound. Each token's weights w = s q + e (q int8, s = max|w| / 127 in float32, e the
rounding left). For a row x, the product's float32 value c differs from the screen's
s * (q . x) by at most

    |e . x| + |c - w . x| + s |(q . x) - computed| <= G ||x||,
    G = ||e|| + rho (||w|| + s ||q||),

by Cauchy-Schwarz. rho = 2^-10 covers a float32 sum of up to 4,096 terms (lm_head's K is
896) in any order, rounded or truncated: at most K 2^-23 of the sum of the terms' sizes.
The scalings and additions after the products round once each (2^-24), within that slack.
Rounding to the model's dtype is monotone, so a token whose rounded upper bound is below
the rounded best lower bound of its row can be neither the maximum nor tied with it; a
block is flagged where any of its tokens is not ruled out. A NaN ranks above every number
(torch.argmax's rule), so one flags its block, and a NaN lower bound excludes nothing.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from codespec.kernels._triton_linear import _nan_largest
from codespec.kernels.row_linear import Config, row_linear

RHO = 2.0 ** -10
# The screen's pipeline depth, named: the sm_90 build with it copies the int8 tiles in 16
# bytes at a time, asynchronously (test_sm90_compile.py); a build without it read 4.
STAGES = 3


@triton.jit
def _screen_kernel(x_ptr, q_ptr, scale_ptr, bound_ptr, norm_ptr, hi_ptr, lo_ptr, s_x, s_q, s_out, K: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, UPCAST: tl.constexpr):
    # One program per (vocab block, block of rows): the rows' int8 products over the block,
    # scaled, and each row's largest upper and lower bound in the block.
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for first in range(0, K, BLOCK_K):
        k = first + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + m[:, None] * s_x + k[None, :])
        q = tl.load(q_ptr + n[:, None] * s_q + k[None, :])
        # not row_linear's _dot(x, q.to(bf16)): the interpreter casts int8 to bf16 wrongly
        # (NaNs), so its path takes int8 straight to float32
        if UPCAST:
            acc += tl.dot(x.to(tl.float32), tl.trans(q.to(tl.float32)))
        else:  # |q| <= 127 is exact in bf16
            acc += tl.dot(x, tl.trans(q.to(x.dtype)))
    approx = acc * tl.load(scale_ptr + n).to(tl.float32)[None, :]
    margin = tl.load(bound_ptr + n)[None, :] * tl.load(norm_ptr + m)[:, None]
    hi = _nan_largest(approx + margin)  # a NaN: its block flagged
    lo = approx - margin
    lo = tl.where(lo == lo, lo, float("-inf"))  # a NaN excludes nothing
    block = tl.program_id(0)
    tl.store(hi_ptr + m * s_out + block, tl.max(hi, axis=1))
    tl.store(lo_ptr + m * s_out + block, tl.max(lo, axis=1))


class Screen:
    """lm_head `weight` [vocab, K] in int8 with a scale and a bound per token (module
    docstring), computed in float64 and rounded so the bound only grows."""

    def __init__(self, weight: torch.Tensor, block_n: int = 128, block_k: int = 128) -> None:
        vocab, k_size = weight.shape
        block_k = min(block_k, k_size)
        assert k_size <= 4096, f"RHO covers sums of up to 4,096 terms, not {k_size}"
        assert vocab % block_n == 0 and k_size % block_k == 0, (weight.shape, block_n, block_k)
        w = weight.double()
        scale = (w.abs().amax(dim=1) / 127).float()  # the scale the kernel multiplies by
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))
        self.q = torch.round(w / scale.double()[:, None]).clamp(-127, 127).to(torch.int8)
        error = w - scale.double()[:, None] * self.q.double()
        bound = error.norm(dim=1) + RHO * (w.norm(dim=1) + scale.double() * self.q.double().norm(dim=1))
        self.scale, self.bound = scale, (bound * (1 + 2.0 ** -20)).float()
        self.block_n, self.block_k, self.dtype = block_n, block_k, weight.dtype

    @property
    def blocks(self) -> int:
        return self.q.shape[0] // self.block_n

    def bounds(self, x: torch.Tensor, block_m: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's largest upper and lower bound per vocab block, float32 [rows, blocks]."""
        rows, k_size = x.shape
        assert rows % block_m == 0, (rows, block_m)
        # ||x|| in float64, rounded up past float32's rounding of it
        norm = (x.double().norm(dim=1) * (1 + 2.0 ** -20)).float()
        hi = torch.empty(rows, self.blocks, dtype=torch.float32, device=x.device)
        lo = torch.empty_like(hi)
        _screen_kernel[(self.blocks, rows // block_m)](
            x, self.q, self.scale, self.bound, norm, hi, lo, x.stride(0), self.q.stride(0), hi.stride(0), K=k_size,
            BLOCK_M=block_m, BLOCK_N=self.block_n, BLOCK_K=self.block_k,
            UPCAST=not x.is_cuda and x.dtype != torch.float32, num_warps=4, num_stages=STAGES)
        return hi, lo

    def flagged(self, hi: torch.Tensor, lo: torch.Tensor) -> torch.Tensor:
        """bool [rows, blocks]: the blocks that may hold each row's greedy choice."""
        def rounded(t: torch.Tensor) -> torch.Tensor:  # as the product's stored logits round
            return t.to(self.dtype).float()

        best = lo.max(dim=1, keepdim=True).values
        return ~(rounded(hi) < rounded(best))


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
