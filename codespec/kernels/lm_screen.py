"""lm_head's greedy choices through an int8 screen on the cuda backend
(CODESPEC_CUDA_LM_SCREEN): every choice the bits the full product gives,
from ~half its bytes.

Why. lm_head is the step's largest product (an H200 trace, 2026-11-28: 87 us of a ~0.94 ms
step, 155 of a 32-row pass), and a greedy row needs only its argmax. The CPU path
already finds it through an int8 screen (kernels/lmchoice.py). Here, in the fused
layers' graph, four launches for lm_head's two:
1. `head_rows`: the final norm's rows written once, so the screen and the exact product
   read the same operand bits (row_linear's norm sums its partial squares in its tile's
   layout: another kernel's sum may round otherwise), with each row's norm and its best
   lower bound set to -inf;
2. `screen_bounds`: the int8 product of every vocab block, each row's largest upper
   bound per block, its lower bounds raised into the row's best;
3. row_linear over the normed rows with `screened`: a program whose block no row of its
   flags (the block's rounded upper bound below the row's rounded best) stores -inf as
   the block's maximum and computes nothing, the others the product and its choices as
   without the screen;
4. the choices launch as before.
The session-34 probe (scripts/gpu_lmscreen.py) on the default model's real rows: a
median of 2 of the 1,187 blocks flagged a row, at most 13.

The bound. Each token's weights w = s q + e (q int8, s = max|w| / 127 in float32, e the
rounding left). For a row x, the product's float32 value c differs from the screen's
s * (q . x) by at most

    |e . x| + |c - w . x| + s |(q . x) - computed| <= G ||x||,
    G = ||e|| + rho (||w|| + s ||q||),

by Cauchy-Schwarz. rho = 2^-10 covers a float32 sum of up to 4,096 terms (lm_head's K is
896) in any order, rounded or truncated: at most K 2^-23 of the sum of the terms' sizes.
The scalings and additions after the products round once each (2^-24), within that slack;
||x|| is rounded up by NORM_SLACK past its float32 sum. Rounding to the model's dtype is
monotone, so a token whose rounded upper bound is below the rounded best lower bound of
its row can be neither the maximum nor tied with it; a block is flagged where any of its
tokens is not ruled out. A NaN ranks above every number (torch.argmax's rule), so one
flags its block, and a NaN lower bound excludes nothing. The exact product must be
float32 sums of exact products: bf16 or float16 on the GPU (float32 there would be tf32's
rounded operands; `CudaForward` refuses it), any dtype in the interpreter and reference.

>>> w = torch.randn(64, 32) / 6
>>> weights = ScreenWeights.of(w)
>>> x = torch.randn(16, 32)
>>> normed, norms, best = head_rows(x, x.pow(2).sum(1, keepdim=True), torch.ones(32), 1e-6)
>>> hi = screen_bounds(normed, norms, best, weights, block_m=16, block_n=16)
>>> logits = normed @ w.T
>>> flags = flagged(hi, best, normed.dtype)
>>> bool(flags[torch.arange(16), logits.argmax(1) // 16].all())
True
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from codespec.kernels import check, check_live, use_triton
from codespec.kernels.flags import TakeFlag
from codespec.kernels.row_linear import PDL_MODES
from codespec.kernels.trace import TakeTrace

RHO = 2.0 ** -10
NORM_SLACK = 1 + 2.0 ** -10  # ||x|| past float32's rounding of its sum of squares (K 2^-24 at most)
MAX_K = 4096  # RHO covers sums of this many terms


@dataclass(frozen=True)
class ScreenWeights:
    """lm_head `weight` [vocab, K] in int8 with a scale and a bound per token (module
    docstring), computed in float64 and rounded so the bound only grows."""

    q: torch.Tensor  # int8 [vocab, K]
    scale: torch.Tensor  # float32 [vocab]: what the kernel multiplies q . x by
    bound: torch.Tensor  # float32 [vocab]: G, times ||x|| the most c may lie from s (q . x)

    @classmethod
    def of(cls, weight: torch.Tensor, chunk: int = 16384) -> ScreenWeights:
        """The screen of `weight`, `chunk` tokens at a time (float64 copies of the whole
        default lm_head would take 1.1 GB)."""
        vocab, k_size = weight.shape
        check(k_size <= MAX_K, f"the screen's bound covers sums of up to {MAX_K} terms, not {k_size}")
        q = torch.empty(vocab, k_size, dtype=torch.int8, device=weight.device)
        scale = torch.empty(vocab, dtype=torch.float32, device=weight.device)
        bound = torch.empty_like(scale)
        for first in range(0, vocab, chunk):
            w = weight[first:first + chunk].detach().double()
            s = (w.abs().amax(dim=1) / 127).float()
            s = torch.where(s > 0, s, torch.ones_like(s))
            quantised = torch.round(w / s.double()[:, None]).clamp(-127, 127)
            error = w - s.double()[:, None] * quantised
            g = error.norm(dim=1) + RHO * (w.norm(dim=1) + s.double() * quantised.norm(dim=1))
            q[first:first + chunk], scale[first:first + chunk] = quantised.to(torch.int8), s
            bound[first:first + chunk] = (g * (1 + 2.0 ** -20)).float()
        return cls(q, scale, bound)

    @property
    def vocab(self) -> int:
        return self.q.shape[0]


def head_rows(x: torch.Tensor, squares: torch.Tensor, norm: torch.Tensor, eps: float, *,
              live: tuple[torch.Tensor, torch.Tensor] | None = None, pdl: str = "off",
              trace: TakeTrace | None = None, flags: TakeFlag | None = None,
              force_triton: bool | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The final norm of x [rows, K] (RMSNorm with weight `norm` [K], its scale from the
    rows' partial sums of squares `squares`, float32 [rows, B], as row_linear's `norm`
    rounds its operand): (normed [rows, K] in x's dtype, each row's norm rounded up,
    float32 [rows], each row's best lower bound, -inf, float32 [rows]). With `live`, the
    rows without a token are left undefined (the Triton kernel; the reference computes
    every row)."""
    rows, k_size = x.shape
    check(x.dim() == 2 and x.stride(1) == 1 and norm.shape == (k_size,), "x must be [rows, K], the norm's weight [K]")
    check(squares.dtype == torch.float32 and squares.dim() == 2 and squares.shape[0] == rows
          and squares.stride(1) == 1, "squares must be float32 [rows, B]")
    check_live(live, x)
    check(pdl in PDL_MODES, f"pdl {pdl!r}: expected one of {', '.join(PDL_MODES)}")
    normed = torch.empty_like(x)
    norms = torch.empty(rows, dtype=torch.float32, device=x.device)
    best = torch.empty(rows, dtype=torch.float32, device=x.device)
    if use_triton(x, force_triton):
        from codespec.kernels import _triton_screen

        _triton_screen.head_rows(x, squares, norm, eps, normed, norms, best, live, pdl != "off" and x.is_cuda, trace,
                                 flags, NORM_SLACK)
    else:
        x32 = x.float()
        scale = torch.rsqrt(squares.sum(dim=1, keepdim=True) / k_size + eps)
        normed.copy_(((x32 * scale).to(x.dtype).float() * norm.float()).to(x.dtype))
        norms.copy_(normed.float().pow(2).sum(dim=1).sqrt() * NORM_SLACK)
        best.fill_(float("-inf"))
    return normed, norms, best


def screen_bounds(normed: torch.Tensor, norms: torch.Tensor, best: torch.Tensor, weights: ScreenWeights, *,
                  block_m: int, block_n: int, flag_n: int | None = None, block_k: int = 128, row_group: int = 1,
                  live: tuple[torch.Tensor, torch.Tensor] | None = None, pdl: str = "off",
                  trace: TakeTrace | None = None, flags: TakeFlag | None = None,
                  force_triton: bool | None = None) -> torch.Tensor:
    """Each row's largest upper bound on its logits in each block of `flag_n` tokens (the
    exact product's block of outputs; default `block_n`), float32 [rows, vocab / flag_n];
    each row's largest lower bound raised into `best` (head_rows' -inf). A program
    screens `block_m` rows over `block_n` tokens (a multiple of `flag_n`), in groups of
    `row_group` blocks of rows reading each int8 tile once (1, 2 or 4). With `live`,
    the rows without a token are left as they were (the Triton kernel; the reference
    bounds every row). `pdl` prefetch: each program warms its block's int8 weights into
    L2 before it waits for the kernel before."""
    rows, k_size = normed.shape
    check(normed.dim() == 2 and normed.stride(1) == 1 and k_size == weights.q.shape[1],
          "normed must be [rows, K] for the screen's [vocab, K]")
    check(norms.shape == (rows,) and best.shape == (rows,) and best.dtype == torch.float32,
          "norms and best must be float32 [rows]")
    block_k = min(block_k, k_size)
    while block_k > 16 and k_size % block_k:
        block_k //= 2
    flag_n = flag_n or block_n
    check(row_group in (1, 2, 4), f"a row group of 1, 2 or 4 blocks, not {row_group}")
    check(rows % (block_m * row_group) == 0 and weights.vocab % block_n == 0 and k_size % block_k == 0
          and block_n % flag_n == 0,
          f"blocks of {block_m} rows ({row_group} a group), {block_n} tokens ({flag_n} a flag), {block_k} columns "
          f"do not tile {rows}x{weights.vocab}x{k_size}")
    check_live(live, normed)
    check(pdl in PDL_MODES, f"pdl {pdl!r}: expected one of {', '.join(PDL_MODES)}")
    hi = torch.empty(rows, weights.vocab // flag_n, dtype=torch.float32, device=normed.device)
    if use_triton(normed, force_triton):
        from codespec.kernels import _triton_screen

        cuda_pdl = pdl != "off" and normed.is_cuda
        _triton_screen.screen(normed, weights.q, weights.scale, weights.bound, norms, hi, best, block_m, block_n,
                              flag_n, block_k, row_group, live, cuda_pdl, cuda_pdl and pdl == "prefetch", trace, flags)
    else:
        approx = (normed.double() @ weights.q.double().T).float() * weights.scale
        margin = weights.bound[None, :] * norms[:, None]
        upper = (approx + margin).nan_to_num(nan=float("inf"), posinf=float("inf"), neginf=float("-inf"))
        lower = (approx - margin).nan_to_num(nan=float("-inf"), posinf=float("inf"), neginf=float("-inf"))
        hi.copy_(upper.view(rows, -1, flag_n).amax(dim=2))
        best.copy_(torch.maximum(best, lower.amax(dim=1)))
    return hi


def flagged(hi: torch.Tensor, best: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """bool [rows, blocks]: the blocks that may hold each row's greedy choice (their upper
    bound, rounded to `dtype` as the product's stored logits round, not below the row's
    rounded best lower bound): what row_linear's `screened` programs decide, in torch."""
    def rounded(t: torch.Tensor) -> torch.Tensor:
        return t.to(dtype).float()

    return ~(rounded(hi) < rounded(best)[:, None])
