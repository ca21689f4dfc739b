"""The Triton kernels behind `row_linear` (imported only when one runs: on CUDA tensors,
or on CPU under `TRITON_INTERPRET=1` in the tests). The wrapper checked the arguments."""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _operand(x_ptr, norm_ptr, m, k, k_size, s_x, scale, NORM: tl.constexpr, GATED: tl.constexpr):
    """The product's left operand for rows m, columns k, in the model's dtype, rounded
    where transformers' eager code rounds: the norm's normalised x, then its weight times
    that; SiLU(gate), then times up."""
    dtype = x_ptr.dtype.element_ty
    if GATED:  # x holds [gate | up], each k_size wide
        gate = tl.load(x_ptr + m[:, None] * s_x + k[None, :]).to(tl.float32)
        up = tl.load(x_ptr + m[:, None] * s_x + k_size + k[None, :]).to(tl.float32)
        silu = (gate * tl.sigmoid(gate)).to(dtype).to(tl.float32)
        return (silu * up).to(dtype)
    x = tl.load(x_ptr + m[:, None] * s_x + k[None, :])
    if NORM:
        normed = (x.to(tl.float32) * scale[:, None]).to(dtype).to(tl.float32)
        return (normed * tl.load(norm_ptr + k).to(tl.float32)[None, :]).to(dtype)
    return x


@triton.jit
def _row_linear_kernel(x_ptr, w_ptr, bias_ptr, norm_ptr, residual_ptr, out_ptr, part_ptr, k_size, eps,
                       s_x, s_w, s_residual, s_out, s_part_split, s_part,
                       STEPS_PER_SPLIT: tl.constexpr, SPLITS: tl.constexpr, HAS_BIAS: tl.constexpr,
                       NORM: tl.constexpr, GATED: tl.constexpr, RESIDUAL: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, UPCAST: tl.constexpr):
    # One program per (BLOCK_N outputs, split of K, BLOCK_M rows): its K range is fixed by
    # the split's index alone, walked in BLOCK_K steps; an output row depends on its own
    # input row (a tensor-core product never mixes rows; the norm's sum is per row).
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    split = tl.program_id(1)
    m = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    scale = tl.zeros([BLOCK_M], tl.float32)
    if NORM:  # RMSNorm's 1 / rms over the whole row, in float32, BLOCK_K at a time
        squares = tl.zeros([BLOCK_M], tl.float32)
        for begin in range(0, k_size, BLOCK_K):
            x = tl.load(x_ptr + m[:, None] * s_x + begin + tl.arange(0, BLOCK_K)[None, :]).to(tl.float32)
            squares += tl.sum(x * x, axis=1)
        scale = tl.rsqrt(squares / k_size + eps)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    first = split * STEPS_PER_SPLIT * BLOCK_K
    last = tl.minimum(first + STEPS_PER_SPLIT * BLOCK_K, k_size)
    for begin in range(first, last, BLOCK_K):
        k = begin + tl.arange(0, BLOCK_K)
        a = _operand(x_ptr, norm_ptr, m, k, k_size, s_x, scale, NORM, GATED)
        w = tl.load(w_ptr + n[:, None] * s_w + k[None, :])
        if UPCAST:  # the interpreter's bf16 tl.dot returns garbage (triton 3.9): the tests' path
            a, w = a.to(tl.float32), w.to(tl.float32)
        acc += tl.dot(a, tl.trans(w))
    if SPLITS == 1:
        _finish(acc, bias_ptr, residual_ptr, out_ptr, m, n, s_residual, s_out, HAS_BIAS, RESIDUAL)
    else:
        tl.store(part_ptr + split * s_part_split + m[:, None] * s_part + n[None, :], acc)


@triton.jit
def _finish(acc, bias_ptr, residual_ptr, out_ptr, m, n, s_residual, s_out, HAS_BIAS: tl.constexpr,
            RESIDUAL: tl.constexpr):
    """bias, then the product rounded to the model's dtype, then the residual added and
    rounded again: transformers' `hidden + linear(x)`."""
    dtype = out_ptr.dtype.element_ty
    if HAS_BIAS:
        acc += tl.load(bias_ptr + n).to(tl.float32)[None, :]
    if RESIDUAL:
        residual = tl.load(residual_ptr + m[:, None] * s_residual + n[None, :]).to(tl.float32)
        acc = acc.to(dtype).to(tl.float32) + residual
    tl.store(out_ptr + m[:, None] * s_out + n[None, :], acc.to(dtype))


@triton.jit
def _row_linear_reduce_kernel(part_ptr, bias_ptr, residual_ptr, out_ptr, s_part_split, s_part, s_residual, s_out,
                              SPLITS: tl.constexpr, HAS_BIAS: tl.constexpr, RESIDUAL: tl.constexpr,
                              BLOCK: tl.constexpr):
    # One program per row and BLOCK outputs: the splits' partial sums added in split order.
    m = tl.program_id(1) + tl.zeros([1], tl.int32)
    n = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    acc = tl.load(part_ptr + m[:, None] * s_part + n[None, :])
    for split in range(1, SPLITS):
        acc += tl.load(part_ptr + split * s_part_split + m[:, None] * s_part + n[None, :])
    _finish(acc, bias_ptr, residual_ptr, out_ptr, m, n, s_residual, s_out, HAS_BIAS, RESIDUAL)


def row_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, norm: torch.Tensor | None,
               eps: float, gated: bool, residual: torch.Tensor | None, out: torch.Tensor, block_m: int, block_n: int,
               block_k: int, splits: int, num_warps: int, num_stages: int) -> None:
    rows = x.shape[0]
    n_size, k_size = weight.shape
    steps = k_size // block_k
    per_split = triton.cdiv(steps, splits)
    splits = triton.cdiv(steps, per_split)  # no empty split
    part = torch.empty(splits, rows, n_size, dtype=torch.float32, device=x.device) if splits > 1 else out
    flags = dict(HAS_BIAS=bias is not None, RESIDUAL=residual is not None)
    pointers = (bias if bias is not None else out, residual if residual is not None else out)
    s_residual = residual.stride(0) if residual is not None else 0
    _row_linear_kernel[(n_size // block_n, splits, rows // block_m)](
        x, weight, pointers[0], norm if norm is not None else out, pointers[1], out, part, k_size, float(eps),
        x.stride(0), weight.stride(0), s_residual, out.stride(0), part.stride(0) if splits > 1 else 0,
        part.stride(1) if splits > 1 else 0, STEPS_PER_SPLIT=per_split, SPLITS=splits, NORM=norm is not None,
        GATED=gated, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        UPCAST=_INTERPRETED and x.dtype != torch.float32, num_warps=num_warps, num_stages=num_stages, **flags)
    if splits > 1:
        block = 128 if n_size % 128 == 0 else block_n
        _row_linear_reduce_kernel[(n_size // block, rows)](
            part, *pointers, out, part.stride(0), part.stride(1), s_residual, out.stride(0), SPLITS=splits,
            BLOCK=block, **flags)
