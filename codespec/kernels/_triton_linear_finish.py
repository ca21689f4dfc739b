"""A row_linear product's outputs after its K loop (kernels/_triton_linear.py): the
epilogue (bias, rounding as transformers rounds, the residual, SiLU pairs, rotary and the
K/V store, each row's sums of squares or block maxima), the reduce kernel that finishes a
split product with the same epilogue, and the choices launch that picks each row's first
maximum from the block maxima. Imported only when a kernel runs."""

from __future__ import annotations

import triton
import triton.language as tl

from codespec.kernels._triton import holds_token, live_rows, rotary_rounded
from codespec.kernels._triton_pdl import COUNTED, pdl_done, pdl_start, pdl_wait_for


@triton.jit
def _finish(acc, bias_ptr, residual_ptr, out_ptr, block_out_ptr, index_out_ptr, m, n_first, s_residual, s_out,
            s_block_out, context_ptr, path_len_ptr, cos_ptr, sin_ptr, positions_ptr, wslot_ptr, wpos_ptr, k_ptr, v_ptr,
            s_rope, s_kv_slot, s_kv_head, s_kv_pos, HAS_BIAS: tl.constexpr, RESIDUAL: tl.constexpr,
            PAIRS: tl.constexpr, SQUARES_OUT: tl.constexpr, CHOICES: tl.constexpr, ROPE: tl.constexpr,
            HEADS: tl.constexpr, KV_HEADS: tl.constexpr, DIM: tl.constexpr, BLOCK_M: tl.constexpr,
            BLOCK_N: tl.constexpr, inputs, INPUTS_READ: tl.constexpr):
    """Outputs n_first.. (BLOCK_N of them) of rows m: bias, then the product rounded to
    the model's dtype, then the residual added and rounded again (transformers' `hidden +
    linear(x)`).
    One float per row for this block into block_out: with SQUARES_OUT the
    sum of squares of what is stored (the next product's norm); with CHOICES its maximum,
    and its first index into index_out (the rows' greedy choices, _choices_kernel). PAIRS:
    the columns are (gate, up) pairs, and what is stored is SiLU(gate) * up, BLOCK_N / 2
    outputs from n_first / 2, rounded as transformers' MLP rounds (gate and up, SiLU, the
    product). ROPE: the columns are q, k and v heads; q and k rotated, q stored, K and V
    into the cache. `inputs`: what the epilogue reads that no kernel writes
    (_epilogue_inputs), as the caller read it where INPUTS_READ, else read here."""
    dtype = out_ptr.dtype.element_ty
    n = n_first + tl.arange(0, BLOCK_N)
    if not INPUTS_READ:
        inputs = _epilogue_inputs(m, n_first, bias_ptr, context_ptr, path_len_ptr, cos_ptr, sin_ptr, positions_ptr,
                                  wslot_ptr, wpos_ptr, s_rope, s_kv_slot, s_kv_head, s_kv_pos, HAS_BIAS, ROPE, HEADS,
                                  KV_HEADS, DIM, BLOCK_M, BLOCK_N)
    bias, cos_lo, cos_hi, sin_lo, sin_hi, kv_at, holds = inputs
    if HAS_BIAS:
        acc += bias[None, :]
    if PAIRS:
        gate, up = tl.split(tl.reshape(acc.to(dtype).to(tl.float32), [BLOCK_M, BLOCK_N // 2, 2]))
        silu = (gate * tl.sigmoid(gate)).to(dtype).to(tl.float32)
        half = n_first // 2 + tl.arange(0, BLOCK_N // 2)
        tl.store(out_ptr + m[:, None] * s_out + half[None, :], (silu * up).to(dtype))
    elif ROPE:
        _rope_epilogue(acc.to(dtype), m, n_first, out_ptr, s_out, k_ptr, v_ptr, cos_lo, cos_hi, sin_lo, sin_hi, kv_at,
                       holds, HEADS, KV_HEADS, DIM, BLOCK_M, BLOCK_N)
    else:
        if RESIDUAL:
            residual = tl.load(residual_ptr + m[:, None] * s_residual + n[None, :]).to(tl.float32)
            acc = acc.to(dtype).to(tl.float32) + residual
        result = acc.to(dtype)
        tl.store(out_ptr + m[:, None] * s_out + n[None, :], result)
        stored = result.to(tl.float32)
        block = m * s_block_out + n_first // BLOCK_N  # this block's float in each row's list
        if SQUARES_OUT:
            tl.store(block_out_ptr + block, tl.sum(stored * stored, axis=1))
        if CHOICES:
            ranked = _nan_largest(stored)
            tl.store(block_out_ptr + block, tl.max(ranked, axis=1))
            tl.store(index_out_ptr + block, n_first + tl.argmax(ranked, axis=1, tie_break_left=True))


@triton.jit
def _epilogue_inputs(m, n_first, bias_ptr, context_ptr, path_len_ptr, cos_ptr, sin_ptr, positions_ptr, wslot_ptr,
                     wpos_ptr, s_rope, s_kv_slot, s_kv_head, s_kv_pos, HAS_BIAS: tl.constexpr, ROPE: tl.constexpr,
                     HEADS: tl.constexpr, KV_HEADS: tl.constexpr, DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr):
    # What the epilogue of outputs n_first.. of rows m reads that no kernel writes: the
    # bias, and with ROPE the rotary tables at the rows' positions (q and k blocks; each
    # [BLOCK_M, 1, DIM // 2]), where the rows' K or V go in the cache and which rows hold a
    # token (k and v blocks). Zeros where the block has none of it: a v block is not
    # rotated, a q block not stored in the cache.
    n = n_first + tl.arange(0, BLOCK_N)
    bias = tl.zeros([BLOCK_N], tl.float32)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + n).to(tl.float32)
    HALF: tl.constexpr = DIM // 2
    cos_lo = tl.zeros([BLOCK_M, 1, HALF], tl.float32)
    cos_hi, sin_lo, sin_hi = cos_lo, cos_lo, cos_lo
    kv_at = tl.zeros([BLOCK_M, BLOCK_N], tl.int64)
    holds = tl.zeros([BLOCK_M], tl.int1)
    if ROPE:
        block = m * 0 + n_first  # [BLOCK_M] (a scalar's & with a tensor: a mask the interpreter refuses)
        rotated = block < (HEADS + KV_HEADS) * DIM  # a q or k block
        at = (tl.load(positions_ptr + m, mask=rotated, other=0)[:, None, None] * s_rope
              + tl.arange(0, HALF)[None, None, :])
        inside = rotated[:, None, None]
        cos_lo = tl.load(cos_ptr + at, mask=inside, other=0.0).to(tl.float32)
        cos_hi = tl.load(cos_ptr + at + HALF, mask=inside, other=0.0).to(tl.float32)
        sin_lo = tl.load(sin_ptr + at, mask=inside, other=0.0).to(tl.float32)
        sin_hi = tl.load(sin_ptr + at + HALF, mask=inside, other=0.0).to(tl.float32)
        cached = block >= HEADS * DIM  # a k or v block
        column = n - HEADS * DIM
        head = (column % (KV_HEADS * DIM)) // DIM
        kv_at = (tl.load(wslot_ptr + m, mask=cached, other=0)[:, None] * s_kv_slot + head[None, :] * s_kv_head
                 + tl.load(wpos_ptr + m, mask=cached, other=0)[:, None] * s_kv_pos + (column % DIM)[None, :])
        # a row without a token stores nothing (its source row stores the same K and V)
        holds = holds_token(context_ptr, path_len_ptr, m, "") & cached
    return bias, cos_lo, cos_hi, sin_lo, sin_hi, kv_at, holds


@triton.jit
def _rope_epilogue(x, m, n_first, q_ptr, s_q, k_ptr, v_ptr, cos_lo, cos_hi, sin_lo, sin_hi, kv_at, holds,
                   HEADS: tl.constexpr, KV_HEADS: tl.constexpr, DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr):
    # x: q/k/v outputs n_first.. of rows m in the model's dtype, whole heads of DIM (a
    # block never straddles q, k and v), and the epilogue's inputs (_epilogue_inputs).
    # Rotary as rope_store computes it (rotary_rounded), on the halves of each head:
    # x_lo * cos - x_hi * sin and x_hi * cos + x_lo * sin.
    dtype = x.dtype
    H: tl.constexpr = BLOCK_N // DIM
    HALF: tl.constexpr = DIM // 2
    if n_first < (HEADS + KV_HEADS) * DIM:
        lo, hi = tl.split(tl.permute(tl.reshape(x, [BLOCK_M, H, 2, HALF]), (0, 1, 3, 2)))
        lo32, hi32 = lo.to(tl.float32), hi.to(tl.float32)
        new_lo = rotary_rounded(lo32, -hi32, cos_lo, sin_lo, dtype)
        new_hi = rotary_rounded(hi32, lo32, cos_hi, sin_hi, dtype)
        x = tl.reshape(tl.permute(tl.join(new_lo, new_hi), (0, 1, 3, 2)), [BLOCK_M, BLOCK_N])
    n = n_first + tl.arange(0, BLOCK_N)
    if n_first < HEADS * DIM:
        tl.store(q_ptr + m[:, None] * s_q + n[None, :], x)
    elif n_first < (HEADS + KV_HEADS) * DIM:
        tl.store(k_ptr + kv_at, x, mask=holds[:, None])
    else:
        tl.store(v_ptr + kv_at, x, mask=holds[:, None])


@triton.jit
def _nan_largest(x):
    # A NaN ranks above every number, as torch.argmax ranks it (its first NaN is the
    # choice). Also what lets the interpreter rank a padding row of NaNs at all: numpy's
    # nanargmax, which it runs, raises on a slice of NaNs alone.
    return tl.where(x == x, x, float("inf"))


@triton.jit
def _split_sum(part_ptr, m, n, s_part_split, s_part, SPLITS: tl.constexpr, READ: tl.constexpr):
    # The splits' partial sums of rows m, outputs n, added in split order: the reduce
    # kernel's and a folded split's one arithmetic. READ: the loads' cache modifier
    # (".cg" where other programs of the same launch wrote the partials).
    total = tl.load(part_ptr + m[:, None] * s_part + n[None, :], cache_modifier=READ)
    for split in range(1, SPLITS):
        total += tl.load(part_ptr + split * s_part_split + m[:, None] * s_part + n[None, :], cache_modifier=READ)
    return total


@triton.jit(do_not_specialize=COUNTED)
def _row_linear_reduce_kernel(part_ptr, bias_ptr, residual_ptr, out_ptr, block_out_ptr, index_out_ptr, context_ptr,
                              path_len_ptr, cos_ptr, sin_ptr, positions_ptr, wslot_ptr, wpos_ptr, k_ptr, v_ptr,
                              flags_ptr, launch, before, s_part_split, s_part, s_residual, s_out, s_block_out, s_rope,
                              s_kv_slot, s_kv_head, s_kv_pos, SPLITS: tl.constexpr, HAS_BIAS: tl.constexpr,
                              RESIDUAL: tl.constexpr, PAIRS: tl.constexpr, SQUARES_OUT: tl.constexpr,
                              CHOICES: tl.constexpr, ROPE: tl.constexpr, HEADS: tl.constexpr, KV_HEADS: tl.constexpr,
                              DIM: tl.constexpr, LIVE: tl.constexpr, PDL: tl.constexpr, BLOCK: tl.constexpr,
                              FLAGS: tl.constexpr):
    # One program per row and BLOCK outputs: the splits' partial sums added in split order.
    pdl_start(PDL)
    pdl_wait_for(flags_ptr, launch, before, PDL, FLAGS)
    m = tl.program_id(1) + tl.zeros([1], tl.int32)
    n_first = tl.program_id(0) * BLOCK
    if tl.max(live_rows(context_ptr, path_len_ptr, m, LIVE, "").to(tl.int32), axis=0) > 0:
        acc = _split_sum(part_ptr, m, n_first + tl.arange(0, BLOCK), s_part_split, s_part, SPLITS, "")
        _finish(acc, bias_ptr, residual_ptr, out_ptr, block_out_ptr, index_out_ptr, m, n_first, s_residual, s_out,
                s_block_out, context_ptr, path_len_ptr, cos_ptr, sin_ptr, positions_ptr, wslot_ptr, wpos_ptr, k_ptr,
                v_ptr, s_rope, s_kv_slot, s_kv_head, s_kv_pos, HAS_BIAS, RESIDUAL, PAIRS, SQUARES_OUT, CHOICES, ROPE,
                HEADS, KV_HEADS, DIM, 1, BLOCK, None, False)
    pdl_done(flags_ptr, launch, FLAGS)


@triton.jit(do_not_specialize=COUNTED)
def _choices_kernel(block_out_ptr, index_out_ptr, choices_ptr, flags_ptr, launch, before, s_block_out,
                    N: tl.constexpr, BLOCKS: tl.constexpr, BLOCKS_PAD: tl.constexpr, PDL: tl.constexpr,
                    FLAGS: tl.constexpr):
    # One program per row: the first block holding the row's maximum, in block order, and
    # that block's first index of it: torch.argmax's first maximum of the stored row.
    pdl_start(PDL)
    pdl_wait_for(flags_ptr, launch, before, PDL, FLAGS)
    row = tl.program_id(0)
    b = tl.arange(0, BLOCKS_PAD)
    best = _nan_largest(tl.load(block_out_ptr + row * s_block_out + b, mask=b < BLOCKS, other=float("-inf")))
    # no NaN left, so the first maximum is one of the row's blocks (a padding block's -inf
    # ties lose to the first); a row no program computed (a block of rows without a token)
    # holds whatever memory held: its index kept within bounds, so its choice is some token
    block = tl.argmax(best, axis=0, tie_break_left=True)
    index = tl.load(index_out_ptr + row * s_block_out + block)
    tl.store(choices_ptr + row, tl.minimum(tl.maximum(index, 0), N - 1).to(tl.int64))
    pdl_done(flags_ptr, launch, FLAGS)
