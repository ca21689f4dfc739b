"""Row-exact products for the CUDA backend's fixed-shape passes: y = a @ W.T (+ bias)
(+ residual) in one Triton program per block of outputs, over a fixed split of K, where
`a` is x itself, RMSNorm(x) (`norm`) or SiLU(gate) * up of x = [gate | up] (`gated`).

Why our own. cuBLAS's kernels are exact per shape too (forward/cuda.py runs one shape),
but a product of its own cannot take the work around it: the norm before q/k/v and
gate/up, SiLU before down and the residual add after o and down are separate launches
beside cuBLAS (a third of a step's kernels on the H100). Here the tile and the split of
K are ours: every output is one float32 sum over K in a fixed order (BLOCK_K steps
within a split, the splits added in split order), the norm's sum of squares is per row,
and each rounding to the model's dtype falls where transformers' eager code rounds. So
a row's bits depend on its own input row and the configuration alone.

Rows without a token. The cuda backend's bucket is 64 rows whatever the pass holds, and
a plain step holds one. With `live` (the pass's context and path lengths) a program
reads and computes only the rows that hold a token (the others' loads are masked: no
bytes move) and a block of padding rows does nothing; a live row's arithmetic is
unchanged, so are its bits. The fused layers' norm walks each program's rows of x before
its K loop: 114 KB from L2 a program for 64 rows (session 23 measured those products at
2-4x cuBLAS's), 1.8 KB for a step's one row.

`Config` fixes the tiles; `row_linear_ref` is the same arithmetic in plain torch (what
CPU tensors run).

>>> x, w = torch.randn(16, 64), torch.randn(32, 64)
>>> torch.allclose(row_linear_ref(x, w, None), x @ w.T, atol=1e-4)
True
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from codespec.kernels import check, check_live, use_triton


PDL_MODES = ("off", "launch", "prefetch")  # CODESPEC_CUDA_PDL (kernels/_triton_pdl.py)


@dataclass(frozen=True)
class Config:
    block_m: int = 64  # rows per program: the bucket (forward/cuda.py)
    block_n: int = 32
    block_k: int = 128
    splits: int = 1  # K cut into this many fixed ranges, summed in order by a second kernel
    num_warps: int = 4
    num_stages: int = 4

    def fits(self, rows: int, n_size: int, k_size: int) -> bool:
        return rows % self.block_m == 0 and n_size % self.block_n == 0 and k_size % self.block_k == 0

    def fitted(self, rows: int, n_size: int, k_size: int) -> Config | None:
        """This config with each block halved (down to 16) until it tiles the shape; None
        when no such config does (a dimension that is not a multiple of 16)."""
        sizes = {"block_m": (self.block_m, rows), "block_n": (self.block_n, n_size), "block_k": (self.block_k, k_size)}
        changes = {}
        for name, (block, size) in sizes.items():
            while block > 16 and size % block:
                block //= 2
            if size % block:
                return None
            changes[name] = block
        return replace(self, **changes)


def row_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
               norm: tuple[torch.Tensor, float] | None = None, gated: bool = False,
               residual: torch.Tensor | None = None, config: Config = Config(), out: torch.Tensor | None = None,
               live: tuple[torch.Tensor, torch.Tensor] | None = None, pdl: str = "off",
               counts: torch.Tensor | None = None, force_triton: bool | None = None) -> torch.Tensor:
    """[rows, K] (or [rows, 2K] when gated) -> [rows, N] in x's dtype (module docstring);
    `norm` is (RMSNorm weight [K], eps). `live` (a pass's context and path_len, [rows]
    each): only the rows that hold a token (context + path > 0) are read and computed,
    the others' outputs are left undefined (the Triton kernels; the reference computes
    every row). `pdl` (launch or prefetch; CUDA, sm_90+): launched as a programmatic
    dependent, and with `prefetch` each program warms its own weights into L2 before it
    waits for the kernel before (kernels/_triton_pdl.py). `counts` (int32 zeros, at least
    one per block of outputs and rows, left zero; CODESPEC_CUDA_REDUCE=fold): a split of K
    is added up by the program that stores a block's last split, not by a second launch,
    in the same order (the same bits)."""
    n_size, k_size = weight.shape
    check(x.dim() == 2 and weight.dim() == 2 and x.shape[1] == k_size * (2 if gated else 1),
          "x must be [rows, K] ([rows, 2K] with gated) for a weight [N, K]")
    check(not (gated and norm is not None), "a product takes the norm or the gate, not both")
    check(x.stride(1) == 1 and weight.stride(1) == 1, "the last dimension must be contiguous")
    check(bias is None or bias.shape == (n_size,), "bias must be [N]")
    check(norm is None or norm[0].shape == (k_size,), "the norm's weight must be [K]")
    check(residual is None or (residual.shape == (x.shape[0], n_size) and residual.stride(1) == 1),
          "residual must be [rows, N]")
    check(config.fits(x.shape[0], n_size, k_size),
          f"{config} does not tile rows {x.shape[0]}, N {n_size}, K {k_size}")
    check_live(live, x)
    check(pdl in PDL_MODES, f"pdl {pdl!r}: expected one of {', '.join(PDL_MODES)}")
    blocks = (n_size // config.block_n) * (x.shape[0] // config.block_m)
    check(counts is None or (counts.dtype == torch.int32 and counts.dim() == 1 and counts.numel() >= blocks
                             and counts.device == x.device), f"counts must be [>= {blocks}] int32 zeros on x's device")
    if out is None:
        out = torch.empty(x.shape[0], n_size, dtype=x.dtype, device=x.device)
    if use_triton(x, force_triton):
        from codespec.kernels import _triton_linear

        _triton_linear.row_linear(x, weight, bias, None if norm is None else norm[0],
                                  0.0 if norm is None else norm[1], gated, residual, out, config.block_m,
                                  config.block_n, config.block_k, config.splits, config.num_warps, config.num_stages,
                                  live, pdl != "off" and x.is_cuda, pdl == "prefetch" and x.is_cuda, counts)
    else:
        out.copy_(row_linear_ref(x, weight, bias, norm, gated, residual))
    return out


def row_linear_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                   norm: tuple[torch.Tensor, float] | None = None, gated: bool = False,
                   residual: torch.Tensor | None = None) -> torch.Tensor:
    """The kernel's arithmetic in torch: the operand as transformers computes it, the
    product in float32 (float64 for float64 inputs), rounded once, then the residual."""
    if norm is not None:
        x = rms_norm(x, *norm)
    elif gated:
        gate, up = x.chunk(2, dim=-1)
        x = F.silu(gate) * up
    work = torch.float64 if x.dtype == torch.float64 else torch.float32
    y = x.to(work) @ weight.to(work).T
    if bias is not None:
        y = y + bias.to(work)
    y = y.to(x.dtype)
    return y if residual is None else residual + y


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' Qwen2/Llama RMSNorm: in float32, scaled in the input's dtype."""
    x32 = x.to(torch.float32)
    return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
