"""The cuda backend's fused layers (CODESPEC_CUDA_FUSED=1, forward/cuda.py): every product
through kernels/row_linear.py with the work around it in its prologue or epilogue, and
the tiles each product runs.

Each product carries its neighbours: the norm before q/k/v and gate/up, rotary and the KV
store after q/k/v, SiLU after gate/up, the residual add after o and down, the greedy
choices after lm_head (the same roundings as transformers' eager code), or lm_head
behind its int8 screen (`screen`, kernels/lm_screen.py). The embeddings'
gather and o and down also leave the residual stream's sum of squares per block, which
the next norm adds instead of walking the row. The products compute the rows that hold
a token alone (a padding row's hidden state is never read: its K and V come from its
source row, its attention is zeros, its logits go unread)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

import torch

from codespec.errors import SettingError
from codespec.forward.cuda_layers import LayerWeights, eps_of
from codespec.kernels.lm_screen import ScreenWeights, head_rows, screen_bounds
from codespec.kernels.row_linear import Config, Rope, embed_squares, row_linear
from codespec.kernels.trace import TakeTrace

# The fused layers' tiles: the fastest of each fused product (its norm, SiLU or residual
# inside) in the session-23 H100 probe (scripts/gpu_check.py's fusedtiles stage), chosen
# for the first fused layers; the next GPU run's `fusedtiles16` sweeps the rest.
FUSED_TILES = {"qkv": Config(64, 64, 64, splits=8), "o": Config(64, 16, 128),
               "gate_up": Config(64, 128, 128, num_warps=8, num_stages=3), "down": Config(64, 32, 64, splits=8),
               "lm_head": Config(64, 128, 64)}
# lm_head's tile behind its int8 screen (CODESPEC_CUDA_LM_SCREEN): 32 outputs a program, so
# a flagged block is 57 KB for one SM (~2 us at the ~30 GB/s an H200 trace puts an SM
# at), not 128 outputs' 229 KB (~8 us); the screen's programs still read 128 tokens each.
SCREENED_LM_HEAD = Config(64, 32, 64)
SCREEN_BLOCK_N = 128


def whole_heads(tile: Config, head_dim: int, kv_heads: int) -> Config:
    """q/k/v's tile with rotary in its epilogue: each block of outputs whole heads of q,
    of k or of v (the tile's outputs widened to a head, or halved until they divide the
    KV heads' width); a clear error where no such tile exists."""
    tile = replace(tile, block_n=max(tile.block_n, head_dim))
    while tile.block_n > head_dim and (kv_heads * head_dim) % tile.block_n:
        tile = replace(tile, block_n=tile.block_n // 2)
    if tile.block_n % head_dim or (kv_heads * head_dim) % tile.block_n:
        raise SettingError(f"CODESPEC_CUDA_FUSED: no q/k/v tile holds whole heads of {head_dim} "
                           f"(tile {tile.block_n} outputs); unset it")
    return tile


def fused_tiles(layer: LayerWeights, head: torch.Tensor, given: dict[str, Config], rows: int, tile_rows: int,
                row_group: int, head_dim: int, kv_heads: int, screened: bool = False) -> dict[str, Config]:
    """Each product's tiles: `given`, else FUSED_TILES (lm_head's SCREENED_LM_HEAD where
    `screened`) with `tile_rows` rows a program in groups of `row_group` blocks, fitted
    to the model's shapes (`layer`'s and lm_head's) and the bucket's `rows` (a clear
    error where no tile of 16 fits)."""
    shapes = {"qkv": layer.qkv.shape, "o": layer.o.shape, "gate_up": layer.gate_up.shape, "down": layer.down.shape,
              "lm_head": head.shape}
    tiles = {}
    for name, (n_size, k_size) in shapes.items():
        default = SCREENED_LM_HEAD if name == "lm_head" and screened else FUSED_TILES[name]
        tile = given.get(name) or replace(default, block_m=tile_rows, row_group=row_group)
        if name == "qkv":
            tile = whole_heads(tile, head_dim, kv_heads)
        fitted = tile.fitted(rows, n_size, k_size)
        if fitted is None:
            raise SettingError(f"CODESPEC_CUDA_FUSED: no row_linear tile fits {name} ({n_size}x{k_size}) with "
                               f"{rows} rows (every size must be a multiple of 16); unset it")
        tiles[name] = fitted
    return tiles


def layout_tiles(fused: bool, settings: Any, layer: LayerWeights, head: torch.Tensor, given: dict[str, Config],
                 rows: int, head_dim: int, kv_heads: int) -> tuple[dict[str, Config], ...]:
    """The fused layers' tiles (fused_tiles) for each graph a backend of `settings`
    (forward/cuda_settings.CudaSettings) replays: the bucket's; a wide pass's with
    CODESPEC_CUDA_PASS_ROW_GROUP's group of row blocks (None where it is not set or is the
    steps' own); a narrow step's, the bucket's first tile_rows rows alone, with
    CODESPEC_CUDA_NARROW_STEPS (None where not set or the bucket is one block). A clear
    error where either is set without the fused layers; without them, `given` alone."""
    if settings.pass_row_group and not fused:
        raise SettingError("CODESPEC_CUDA_PASS_ROW_GROUP groups the fused products' rows: set CODESPEC_CUDA_FUSED=1")
    if settings.narrow_steps and not fused:
        raise SettingError("CODESPEC_CUDA_NARROW_STEPS computes fewer rows with the fused products (cuBLAS picks "
                           "its kernels by the rows: a narrow pass's bits would not be a full one's): set "
                           "CODESPEC_CUDA_FUSED=1")
    if not fused:
        return given, None, None
    tile_rows, screened = settings.tile_rows, settings.lm_screen

    def tiles_of(bucket: int, row_group: int) -> dict[str, Config]:
        return fused_tiles(layer, head, given, bucket, tile_rows, row_group, head_dim, kv_heads, screened)

    wide = settings.pass_row_group and settings.pass_row_group != settings.row_group
    narrow = settings.narrow_steps and tile_rows < rows
    return (tiles_of(rows, settings.row_group), tiles_of(rows, settings.pass_row_group) if wide else None,
            tiles_of(tile_rows, 1) if narrow else None)


def fused_layers(model: Any, layers: list[LayerWeights], tiles: dict[str, Config], ids: torch.Tensor,
                 attend: Callable[[int, Any, torch.Tensor], torch.Tensor], rope_of: Callable[[int], Rope],
                 linear: dict[str, Any], trace: Callable[..., TakeTrace | None],
                 screen: ScreenWeights | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The pass of a transformers Qwen2/Llama `model` over token `ids` (the bucket's rows):
    its logits, greedy choices and, behind the `screen`, lm_head's normed rows (else
    None; the logits then hold only the blocks the screen flagged: `full_logits`).
    `layers`: its layers' tensors (gate/up in pairs); `attend(index, layer, q)`: attention
    of layer `index`; `rope_of(index)`: that layer's rotary and KV store; `linear`: every
    product's launch arguments (live rows, PDL, counts, flags); `trace(kind, index)`:
    where a traced launch takes its region."""
    body = model.model
    width = body.config.hidden_size
    hidden, squares = embed_squares(ids, body.embed_tokens.weight, width // tiles["down"].block_n,
                                    pdl=linear["pdl"], flags=linear["flags"])
    rows = hidden.shape[0]
    for index, (layer, w) in enumerate(zip(body.layers, layers)):
        q = row_linear(hidden, w.qkv, w.qkv_bias, norm=(w.input_norm, w.input_eps), squares=squares,
                       rope=rope_of(index), config=tiles["qkv"], trace=trace("qkv", index), **linear)
        squares = hidden.new_empty(rows, width // tiles["o"].block_n, dtype=torch.float32)
        hidden = row_linear(attend(index, layer, q), w.o, w.o_bias, residual=hidden, squares_out=squares,
                            config=tiles["o"], trace=trace("o", index), **linear)
        activated = row_linear(hidden, w.gate_up, norm=(w.post_norm, w.post_eps), squares=squares, pairs=True,
                               config=tiles["gate_up"], trace=trace("gate_up", index), **linear)
        squares = hidden.new_empty(rows, width // tiles["down"].block_n, dtype=torch.float32)
        hidden = row_linear(activated, w.down, residual=hidden, squares_out=squares, config=tiles["down"],
                            trace=trace("down", index), **linear)
    head, tile = model.lm_head, tiles["lm_head"]
    choices = torch.empty(rows, dtype=torch.int64, device=hidden.device)
    if screen is None:
        logits = row_linear(hidden, head.weight, head.bias, norm=(body.norm.weight, eps_of(body.norm)),
                            squares=squares, choices=choices, config=tile, trace=trace("lm_head"), **linear)
        return logits, choices, None
    # four launches: the normed rows once, the screen, the flagged blocks, the choices
    launch = {name: linear[name] for name in ("live", "pdl", "flags")}
    normed, norms, best = head_rows(hidden, squares, body.norm.weight, eps_of(body.norm), trace=trace("lm_norm"),
                                    **launch)
    # the screen's programs over 128 tokens where they hold whole blocks of the product's
    screen_n = SCREEN_BLOCK_N if SCREEN_BLOCK_N % tile.block_n == 0 and screen.vocab % SCREEN_BLOCK_N == 0 \
        else tile.block_n
    # ... each int8 tile loaded once for every block of rows (the screen's sums are its
    # own: any order keeps its bound)
    group = max(g for g in (1, 2, 4) if rows % (tile.block_m * g) == 0)
    hi = screen_bounds(normed, norms, best, screen, block_m=tile.block_m, block_n=screen_n, flag_n=tile.block_n,
                       row_group=group, trace=trace("lm_screen"), **launch)
    # no program warms its weights into L2 (`prefetch`): most blocks are never read, and
    # warming them all would read lm_head's every byte the screen is there to spare
    exact = {**linear, "pdl": "launch" if linear["pdl"] == "prefetch" else linear["pdl"]}
    logits = row_linear(normed, head.weight, choices=choices, screened=(hi, best), config=tile,
                        trace=trace("lm_head"), **exact)
    return logits, choices, normed


def full_logits(model: Any, normed: torch.Tensor, tile: Config,
                live: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """lm_head over a screened pass's normed rows, every block: the screened product's
    kernel and tile, so the blocks it computed have the same bits (each row's own)."""
    return row_linear(normed, model.lm_head.weight, config=tile, live=live)


def screen_of(model: Any, fused: bool, tile: Config | None) -> ScreenWeights:
    """lm_head's int8 screen for CODESPEC_CUDA_LM_SCREEN, or a clear error where its
    bound cannot hold."""
    head = model.lm_head
    weight = head.weight
    if not fused or tile is None:
        raise SettingError("CODESPEC_CUDA_LM_SCREEN screens the fused layers' lm_head: set CODESPEC_CUDA_FUSED=1")
    if head.bias is not None:
        raise SettingError("CODESPEC_CUDA_LM_SCREEN bounds an lm_head without bias; this model's has one: unset it")
    if weight.is_cuda and weight.dtype == torch.float32:
        raise SettingError("CODESPEC_CUDA_LM_SCREEN bounds float32 sums of exact products; a float32 model's "
                           "products on the GPU round their operands to tf32: unset it, or load bf16 weights")
    if tile.splits != 1:
        raise SettingError(f"CODESPEC_CUDA_LM_SCREEN computes lm_head in one split; its tile is {tile}: unset it")
    return ScreenWeights.of(weight.detach())
