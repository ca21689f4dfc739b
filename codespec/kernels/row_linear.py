"""Row-exact products for the CUDA backend's fixed-shape passes: y = a @ W.T (+ bias)
(+ residual) in one Triton program per block of outputs, over a fixed split of K, where
`a` is x itself or RMSNorm(x) (`norm`), and y may be SiLU(gate) * up of interleaved
(gate, up) outputs (`pairs`).

Why our own. cuBLAS's kernels are exact per shape too (forward/cuda.py runs one shape),
but a product of its own cannot take the work around it: the norm before q/k/v and
gate/up, SiLU before down and the residual add after o and down are separate launches
beside cuBLAS (a third of a step's kernels on the H100). Here the tile and the split of
K are ours: every output is one float32 sum over K in a fixed order (BLOCK_K steps
within a split, the splits added in split order), the norm's sum of squares is per row,
and each rounding to the model's dtype falls where transformers' eager code rounds. So
a row's bits depend on its own input row and the configuration alone.

Nothing serial before the product's loop (the fused layers' second version).
An H100 run measured the first fused products at 2-4x cuBLAS's, and their compiled code
shows why: the norm walked each program's rows of x, BLOCK_K at a time, a chain of
dependent loads before the weights' pipelined loop began, and SiLU(gate) * up was
recomputed from both halves by every column block of down. Now the product that writes
the residual stream (o, down: `squares_out`) also writes each row's sum of squares per
block of its outputs, and the next product's norm adds those few floats (`squares`);
and gate/up's weight rows come interleaved, (gate_j, up_j), so its own epilogue stores
SiLU(gate) * up once (`pairs`), and down reads a plain operand. The sum of squares is
then added in another order than the walk's: its bits differ from the walk's, but are
still the row's alone.

Rows without a token. The cuda backend's bucket is 64 rows whatever the pass holds, and
a plain step holds one. With `live` (the pass's context and path lengths) a program
reads and computes only the rows that hold a token (the others' loads are masked: no
bytes move) and a block of padding rows does nothing; a live row's arithmetic is
unchanged, so are its bits.

Row groups (`Config.row_group`). With 16-row programs a pass of 32 rows was
two programs a block of outputs, each reading the block's weights: the pass read every
weight twice. A program now computes up to `row_group` blocks of rows with each weight
tile it loads, each block its own product of the block's shape, and only the blocks up
to the last that holds a token: a row's bits are a group of one's, and a step's program
runs a group of one's loop.

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
from codespec.kernels.flags import TakeFlag
from codespec.kernels.trace import TakeTrace


PDL_MODES = ("off", "launch", "prefetch")  # CODESPEC_CUDA_PDL (kernels/_triton_pdl.py)


@dataclass(frozen=True)
class Rope:
    """What q/k/v's epilogue needs for rotary and the KV store (kernels/rope_store.py's
    arguments, its tables form): the product's outputs are q, k and v heads; q comes back
    rotated, K and V go into the cache's layer."""

    cos: torch.Tensor  # [positions, dim] tables
    sin: torch.Tensor
    positions: torch.Tensor  # [rows]: where each row reads the tables
    source: torch.Tensor  # [rows]: a padding row's K and V are its source row's (the reference's stores)
    write_slots: torch.Tensor  # [rows]
    write_positions: torch.Tensor  # [rows]
    keys: torch.Tensor  # [slots, kv_heads, positions, dim]: one layer of the cache
    values: torch.Tensor
    heads: int
    kv_heads: int


@dataclass(frozen=True)
class Config:
    block_m: int = 64  # rows per program: the bucket (forward/cuda.py)
    block_n: int = 32
    block_k: int = 128
    splits: int = 1  # K cut into this many fixed ranges, summed in order by a second kernel
    num_warps: int = 4
    num_stages: int = 4
    # blocks of block_m rows a program computes with each weight tile it loads (1, 2 or 4;
    # each block its own dot, so a row's bits are a group of one's): a pass of several
    # blocks reads the weights once, not once a block (CODESPEC_CUDA_ROW_GROUP)
    row_group: int = 1

    def fits(self, rows: int, n_size: int, k_size: int) -> bool:
        return (rows % (self.block_m * self.row_group) == 0 and n_size % self.block_n == 0
                and k_size % self.block_k == 0)

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
        group = self.row_group
        while group > 1 and rows % (changes["block_m"] * group):
            group //= 2
        return replace(self, **changes, row_group=group)


def row_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
               norm: tuple[torch.Tensor, float] | None = None, squares: torch.Tensor | None = None,
               pairs: bool = False, residual: torch.Tensor | None = None, squares_out: torch.Tensor | None = None,
               rope: Rope | None = None, choices: torch.Tensor | None = None, config: Config = Config(),
               out: torch.Tensor | None = None,
               live: tuple[torch.Tensor, torch.Tensor] | None = None, pdl: str = "off",
               counts: torch.Tensor | None = None, trace: TakeTrace | None = None,
               flags: TakeFlag | None = None, early_rows: bool = False,
               screened: tuple[torch.Tensor, torch.Tensor] | None = None,
               force_triton: bool | None = None) -> torch.Tensor:
    """[rows, K] -> [rows, N] ([rows, N / 2] with `pairs`) in x's dtype (module
    docstring); `norm` is (RMSNorm weight [K], eps). `squares` (float32 [rows, B], B
    dividing K): x's sum of squares per row in B parts, as a product's `squares_out`
    wrote them; the norm's scale comes from them, not from a walk over x. `squares_out`
    (float32 [rows, N / block_n]): written with each block's sum of squares of the
    stored output row. `pairs`: weight rows are (gate, up) pairs (`gate_up_pairs`) and
    the output is SiLU(gate) * up. `rope`: the outputs are q, k and v heads; returns q
    [rows, heads * dim] after rotary, and K and V go into the cache for the rows that
    hold a token (needs `live`; kernels/rope_store.py's arithmetic, the same bits).
    `choices` (int64 [rows]): written with each row's first maximum of the stored output,
    torch.argmax's (lm_head's greedy choices: each block's maximum in the epilogue, then
    one small launch over the blocks, not a pass over the whole logits). `live` (a
    pass's context and path_len, [rows] each): only the rows that hold a token (context +
    path > 0) are read and computed, the others' outputs are left undefined (the Triton kernels; the reference computes every
    row). `pdl` (launch or prefetch; CUDA, sm_90+): launched as a programmatic dependent,
    and with `prefetch` each program warms its own weights into L2 before it waits for
    the kernel before (kernels/_triton_pdl.py). `counts` (int32 zeros, at least one per
    block of outputs and rows, left zero; CODESPEC_CUDA_REDUCE=fold): a split of K is
    added up by the program that stores a block's last split, not by a second launch, in
    the same order (the same bits). `trace` (the Triton kernel): each program's time at
    each phase into the region it gives the launch (kernels/trace.py; the reference has
    no programs to trace). `flags` (CODESPEC_CUDA_PDL=flags): each launch waits on the count the launch before's
    programs raise after their stores, not on its end (kernels/flags.py). `early_rows`
    (with `live` and `pdl`; CODESPEC_CUDA_EARLY_ROWS): which rows hold a token is read
    before the wait for the kernel before, not after it (the pass's metadata, the host's
    copy made before the graph: one round trip off the chain after the wait; the same
    values, the same bits). `screened` (hi float32 [rows, N / block_n], best float32
    [rows]: kernels/lm_screen.py's bounds; with `choices`, no bias, one split): a block
    of outputs that no row holding a token flags is not computed, its outputs left
    undefined and its maximum -inf, so the choices are the full product's (the
    reference computes every block)."""
    n_size, k_size = weight.shape
    rows = x.shape[0]
    check(x.dim() == 2 and weight.dim() == 2 and x.shape[1] == k_size, "x must be [rows, K] for a weight [N, K]")
    check(x.stride(1) == 1 and weight.stride(1) == 1, "the last dimension must be contiguous")
    check(bias is None or bias.shape == (n_size,), "bias must be [N]")
    check(norm is None or norm[0].shape == (k_size,), "the norm's weight must be [K]")
    check(squares is None or (norm is not None and squares.dtype == torch.float32 and squares.dim() == 2
                              and squares.shape[0] == rows and k_size % squares.shape[1] == 0
                              and squares.stride(1) == 1),
          "squares go with a norm: float32 [rows, B] with B dividing K")
    check(residual is None or (residual.shape == (rows, n_size) and residual.stride(1) == 1),
          "residual must be [rows, N]")
    check(not pairs or (n_size % 2 == 0 and residual is None and squares_out is None),
          "pairs (gate, up) take no residual and write no squares")
    check(config.row_group in (1, 2, 4), f"{config}: a row group of 1, 2 or 4 blocks")
    check(config.fits(rows, n_size, k_size),
          f"{config} does not tile rows {rows}, N {n_size}, K {k_size}")
    if rope is not None:
        dim = rope.keys.shape[3]
        check(live is not None and n_size == (rope.heads + 2 * rope.kv_heads) * dim and residual is None
              and not pairs and squares_out is None, "rope needs live rows and q/k/v outputs, nothing else after")
        check(config.block_n % dim == 0 and (rope.heads * dim) % config.block_n == 0
              and (rope.kv_heads * dim) % config.block_n == 0, f"{config} cuts a head of {dim}: rope needs whole heads")
    check(choices is None or (choices.dtype == torch.int64 and choices.shape == (rows,) and not pairs
                              and rope is None and choices.device == x.device),
          "choices must be int64 [rows] on x's device, of a product that stores its outputs")
    check(squares_out is None or (squares_out.dtype == torch.float32
                                  and squares_out.shape == (rows, n_size // config.block_n)
                                  and squares_out.stride(1) == 1),
          f"squares_out must be float32 [rows, {n_size // config.block_n}] (N / block_n)")
    check(screened is None or (choices is not None and bias is None and config.splits == 1
                               and screened[0].shape == (rows, n_size // config.block_n)
                               and screened[1].shape == (rows,)
                               and all(t.dtype == torch.float32 and t.device == x.device for t in screened)),
          f"screened goes with choices, no bias and one split: hi float32 [rows, {n_size // config.block_n}] "
          "(N / block_n), best float32 [rows]")
    check_live(live, x)
    check(pdl in PDL_MODES, f"pdl {pdl!r}: expected one of {', '.join(PDL_MODES)}")
    blocks = (n_size // config.block_n) * (rows // config.block_m)
    check(counts is None or (counts.dtype == torch.int32 and counts.dim() == 1 and counts.numel() >= blocks
                             and counts.device == x.device), f"counts must be [>= {blocks}] int32 zeros on x's device")
    if out is None:
        width = rope.heads * rope.keys.shape[3] if rope is not None else n_size // 2 if pairs else n_size
        out = torch.empty(rows, width, dtype=x.dtype, device=x.device)
    if use_triton(x, force_triton):
        from codespec.kernels import _triton_linear

        _triton_linear.row_linear(x, weight, bias, None if norm is None else norm[0],
                                  0.0 if norm is None else norm[1], squares, pairs, residual, squares_out, choices,
                                  rope, out, config.block_m, config.block_n, config.block_k, config.splits,
                                  config.num_warps, config.num_stages, live, pdl != "off" and x.is_cuda,
                                  pdl == "prefetch" and x.is_cuda, counts, trace, config.row_group, flags,
                                  early_rows and live is not None, screened)
    elif rope is not None:
        from codespec.kernels.rope_store import rope_store

        qkv = row_linear_ref(x, weight, bias, norm)
        q = rope_store(qkv, rope.cos, rope.sin, rope.source, rope.write_slots, rope.write_positions, rope.keys,
                       rope.values, heads=rope.heads, kv_heads=rope.kv_heads, positions=rope.positions)
        out.copy_(q.reshape(rows, -1))
    else:
        out.copy_(row_linear_ref(x, weight, bias, norm, pairs, residual))
        if squares_out is not None:
            squares_out.copy_(block_squares(out, squares_out.shape[1]))
        if choices is not None:
            torch.argmax(out, dim=-1, out=choices)
    return out


def row_linear_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                   norm: tuple[torch.Tensor, float] | None = None, pairs: bool = False,
                   residual: torch.Tensor | None = None) -> torch.Tensor:
    """The kernel's arithmetic in torch: the operand as transformers computes it, the
    product in float32 (float64 for float64 inputs), rounded once, then the residual, or
    SiLU(gate) * up of the pairs."""
    if norm is not None:
        x = rms_norm(x, *norm)
    work = torch.float64 if x.dtype == torch.float64 else torch.float32
    y = x.to(work) @ weight.to(work).T
    if bias is not None:
        y = y + bias.to(work)
    y = y.to(x.dtype)
    if pairs:
        return silu_pairs(y)
    return y if residual is None else residual + y


def silu_pairs(gate_up: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) * up of a product over `gate_up_pairs` weights: its (gate, up) columns
    interleaved."""
    return F.silu(gate_up[:, 0::2]) * gate_up[:, 1::2]


def embed_squares(ids: torch.Tensor, table: torch.Tensor, blocks: int, pdl: str = "off", flags: TakeFlag | None = None,
                  force_triton: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The embeddings of `ids` [rows] from `table` [vocab, width] and their sums of
    squares in `blocks` parts a row (float32 [rows, blocks]): the first norm's `squares`,
    as o and down leave them for the later ones, in the launch that gathers the rows."""
    rows, width = ids.shape[0], table.shape[1]
    block = width // blocks
    check(ids.dim() == 1 and table.dim() == 2 and table.stride(1) == 1, "ids must be [rows], table [vocab, width]")
    check(width % blocks == 0 and block & (block - 1) == 0, f"{blocks} blocks must cut {width} columns in "
                                                             "parts of a power of two")
    check(pdl in PDL_MODES, f"pdl {pdl!r}: expected one of {', '.join(PDL_MODES)}")
    out = torch.empty(rows, width, dtype=table.dtype, device=table.device)
    squares = torch.empty(rows, blocks, dtype=torch.float32, device=table.device)
    if use_triton(table, force_triton):
        from codespec.kernels import _triton_linear

        _triton_linear.embed_squares(ids, table, out, squares, pdl != "off" and table.is_cuda, flags)
    else:
        out.copy_(table.index_select(0, ids))
        squares.copy_(block_squares(out, blocks))
    return out, squares


def block_squares(y: torch.Tensor, blocks: int) -> torch.Tensor:
    """Each row's sum of squares of y in float32, per block of y.shape[1] / blocks columns."""
    return y.float().pow(2).view(y.shape[0], blocks, -1).sum(-1)


def gate_up_pairs(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """The MLP's gate and up weights [I, H] each as one [2I, H] of interleaved rows
    (gate_0, up_0, gate_1, ...): what `pairs` expects, so that every block of outputs
    holds whole pairs."""
    return torch.stack([gate, up], dim=1).reshape(2 * gate.shape[0], gate.shape[1]).contiguous()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' Qwen2/Llama RMSNorm: in float32, scaled in the input's dtype."""
    x32 = x.to(torch.float32)
    return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
