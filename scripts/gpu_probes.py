"""Probes beside the GPU check (scripts/gpu_check.py --stages ...): attention by schedule,
key block and early keys (`attention`), the layer's products with their weights in L2
against from HBM (`l2`), attention by key block alone, the layer's products (cuBLAS
against kernels/row_linear.py's tiles), the backend with the tiles that win, the backend
with fused layers, and smaller buckets."""

from __future__ import annotations

import time
from typing import Any

import torch

from gpu_measure import _graph_us, cost_curve, pass_ms, profile_step, row_checks, step_floor

PRODUCTS = ("qkv", "o", "gate_up", "down")  # a layer's products, in a step's order


@torch.inference_mode()
def attention_probe() -> dict[str, Any]:
    """Device us per call of row_attention (64-row bucket, a 4,096-position slot, the
    default model's heads), in CUDA graphs: a step (one real row) at 512 and 2048 keys,
    passes of 32 chain rows at 512 and 2048 and of 64 at 512, by schedule; whether the
    worklist's rows have the grid's bits (the same code per block and combine: they
    should); the fold's (2026-11-27: its own combine, so its own bits) within bf16's
    rounding of the grid's, and a pass's first row with the bits of the step over the
    same keys; each over 128-key blocks and over 64 (2026-11-28, CODESPEC_CUDA_KEY_BLOCK:
    other bits, the grid's at the same blocks the reference)."""
    from codespec.kernels import row_attention as module

    torch.manual_seed(8)
    keys, values = (torch.randn(2, 2, 4096, 64, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    query = torch.randn(64, 14, 64, device="cuda", dtype=torch.bfloat16)
    zeros = torch.zeros(64, dtype=torch.int64, device="cuda")
    counts = torch.zeros(64 * 2, dtype=torch.int32, device="cuda")
    layouts = {}
    for name, real, keys_in_row in (("step_512", 1, 512), ("step_2048", 1, 2048), ("pass32_512", 32, 512),
                                    ("pass32_2048", 32, 2048), ("pass64_512", 64, 512)):
        context, path_len = zeros.clone(), zeros.clone()
        context[:real] = keys_in_row
        path_len[:real] = torch.arange(1, real + 1, device="cuda")  # a chain: row i sees i + 1 drafted keys
        path = (keys_in_row + torch.arange(64, device="cuda")).repeat(64, 1).contiguous()
        layouts[name] = dict(slots=zeros, context=context, path=path, path_len=path_len)
    # (schedule, programs an SM, warps, key block, early keys); early keys (2026-11-28), alone in
    # a graph with nothing before them to overlap, say their bits are the launch's without
    # them and what the split loads cost, not what they save in a step (`step`, `trace`)
    schedules = {"grid": ("grid", 2, 4, 128, False), "worklist w4 x2": ("worklist", 2, 4, 128, False),
                 "fold w4 x2": ("fold", 2, 4, 128, False), "worklist 64": ("worklist", 2, 4, 64, False),
                 "fold 64": ("fold", 2, 4, 64, False), "fold early": ("fold", 2, 4, 128, True),
                 "fold 64 early": ("fold", 2, 4, 64, True)}
    saved = module.PROGRAMS_PER_SM, module.WORK_WARPS
    result: dict[str, Any] = {}
    try:
        for label, (schedule, per_sm, warps, block, early) in schedules.items():
            module.PROGRAMS_PER_SM, module.WORK_WARPS = per_sm, warps
            # the grid's bits at the same warps and blocks: the combine's reduction is laid out
            # by them; early keys against the same schedule without them
            reference = {name: module.row_attention(query, keys, values, **meta, scale=0.125,
                                                    schedule=schedule if early else "grid", counts=counts,
                                                    key_block=block)
                         for name, meta in layouts.items()}
            entry: dict[str, Any] = {}
            run = {name: (lambda m=meta, s=schedule, e=early: module.row_attention(
                query, keys, values, **m, scale=0.125, schedule=s, counts=counts, key_block=block, early=e))
                   for name, meta in layouts.items()}
            for name in layouts:
                entry[name + "_us"] = _graph_us(run[name])
                got = run[name]()
                if schedule == "fold" and not early:  # its own bits
                    entry[name + "_close_to_grid"] = bool(torch.allclose(got.float(), reference[name].float(),
                                                                         atol=1e-2, rtol=1e-2))
                else:
                    entry[name + "_same_bits"] = bool(torch.equal(reference[name], got))
            for size in ("512", "2048"):  # row 0 of a 32-row pass sees the keys the step's one row does
                entry[f"pass32_row_equals_step_{size}"] = bool(torch.equal(run[f"pass32_{size}"]()[0],
                                                                           run[f"step_{size}"]()[0]))
            entry["counts_left_zero"] = not bool(counts.any())
            result[label] = entry
    finally:
        module.PROGRAMS_PER_SM, module.WORK_WARPS = saved
    return result


@torch.inference_mode()
def l2_probe(loaded: Any) -> dict[str, Any]:
    """Device us per call of the layer's products at the bucket's 64 rows (cuBLAS, in CUDA
    graphs of 24 calls): `layer_cold_us`, every layer's four products in a step's order
    (680 MB, nothing left in L2 from one layer to the next), against `layer_hot_us`, layer
    0's four 24 times (28 MB: in L2 after the first). Per product, `hot_us` (one weight 24
    times) and `cycle_us` (the 24 layers' weights in turn: cold for gate/up and down; the
    q/k/v and o cycles, 48 and 36 MB, may partly stay in L2)."""
    import torch.nn.functional as F

    layers = loaded.forward._layers
    inputs = {name: torch.randn(64, getattr(layers[0], name).shape[1], device="cuda", dtype=torch.bfloat16)
              for name in PRODUCTS}

    def product(name: str, w: Any) -> torch.Tensor:
        bias = w.qkv_bias if name == "qkv" else w.o_bias if name == "o" else None
        return F.linear(inputs[name], getattr(w, name), bias)

    def layer(w: Any) -> None:
        for name in PRODUCTS:
            product(name, w)

    result: dict[str, Any] = {
        "layer_cold_us": round(_graph_us(lambda: [layer(w) for w in layers], calls=1) / len(layers), 2),
        "layer_hot_us": round(_graph_us(lambda: [layer(layers[0]) for _ in layers], calls=1) / len(layers), 2)}
    for name in PRODUCTS:
        weight = getattr(layers[0], name)
        result[name] = {"mb": round(weight.numel() * weight.element_size() / 2**20, 2),
                        "hot_us": round(_graph_us(lambda n=name: [product(n, layers[0]) for _ in layers], calls=1)
                                        / len(layers), 2),
                        "cycle_us": round(_graph_us(lambda n=name: [product(n, w) for w in layers], calls=1)
                                          / len(layers), 2)}
    result["most_saved_per_step_us"] = round((result["layer_cold_us"] - result["layer_hot_us"]) * len(layers), 1)
    return result


def key_block_probe(schedule: str) -> dict[str, Any]:
    """Device us per call of row_attention (the run's `schedule`) for one real row among 64
    (a decode step), in CUDA graphs, by KEY_BLOCK: whether smaller blocks (more programs at
    once) pay."""
    from codespec.kernels import row_attention as module

    torch.manual_seed(6)
    keys, values = (torch.randn(1, 2, 4096, 64, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    query = torch.randn(64, 14, 64, device="cuda", dtype=torch.bfloat16)
    zeros = torch.zeros(64, dtype=torch.int64, device="cuda")
    path = torch.zeros(64, 64, dtype=torch.int64, device="cuda")
    result: dict[str, Any] = {}
    default = module.KEY_BLOCK
    try:
        for block in (64, 128):
            module.KEY_BLOCK = block
            for keys_in_row in (512, 2048):
                context = zeros.clone()
                context[0] = keys_in_row
                result[f"{block}/{keys_in_row}"] = _graph_us(lambda c=context: module.row_attention(
                    query, keys, values, slots=zeros, context=c, path=path, path_len=zeros, scale=0.125,
                    schedule=schedule))
    finally:
        module.KEY_BLOCK = default
    return result


def _products(model: Any) -> dict[str, tuple[torch.Tensor, torch.Tensor | None]]:
    from codespec.forward.cuda_layers import LayerWeights

    w = LayerWeights.of(model.model.layers[0])
    return {"qkv": (w.qkv, w.qkv_bias), "o": (w.o, w.o_bias), "down": (w.down, None), "gate_up": (w.gate_up, None),
            "lm_head": (model.lm_head.weight.detach(), None)}


@torch.inference_mode()
def gemm_probe(loaded: Any, budget_s: float = 75.0) -> dict[str, Any]:
    """The layer's products at the bucket's shape (64 rows), in CUDA graphs: cuBLAS
    (F.linear) against kernels/row_linear.py's tiles, and the fastest tile's row
    exactness and error on the device. Each product gets a share of `budget_s` for tiles."""
    import torch.nn.functional as F

    from codespec.kernels.row_linear import row_linear

    result: dict[str, Any] = {}
    products = _products(loaded.model)
    for name, (weight, bias) in products.items():
        began = time.perf_counter()
        n_size, k_size = weight.shape
        x = torch.randn(64, k_size, device="cuda", dtype=weight.dtype)
        entry: dict[str, Any] = {"n": n_size, "k": k_size, "weight_mb": round(weight.numel() * 2 / 2**20, 2),
                                 "floor_us": round(weight.numel() * 2 / 2.98e12 * 1e6, 2),
                                 "cublas_us": _graph_us(lambda: F.linear(x, weight, bias))}
        swept = _tile_sweep(name, n_size, k_size, lambda c: row_linear(x, weight, bias, config=c),
                            began + budget_s / len(products))
        entry["row_linear_us"] = {key: us for key, (_, us) in swept.items()}
        best, config = _best(swept)
        if best is not None:
            full = row_linear(x, weight, bias, config=config)
            others = torch.randn_like(x)
            others[3] = x[3]
            moved = torch.roll(others, 17, dims=0)
            reference = F.linear(x.float(), weight.float(), None if bias is None else bias.float())
            timed = entry["row_linear_us"]
            entry.update(best=best, best_config=config.__dict__, best_over_cublas=round(timed[best] / entry["cublas_us"], 3),
                         best_row_exact=bool(torch.equal(row_linear(moved, weight, bias, config=config)[20], full[3])),
                         best_relative_error=float((full.float() - reference).norm() / reference.norm()))
        result[name] = entry
    return result


def tiles_probe(loaded: Any, gemm: dict[str, Any]) -> dict[str, Any]:
    """The whole backend with row_linear's fastest tiles where they beat cuBLAS by 5%:
    the step and passes at 512 keys (host wall ms) and its rows against its decode steps."""
    from codespec.kernels.row_linear import Config

    chosen = {name: Config(**entry["best_config"]) for name, entry in gemm.items()
              if isinstance(entry, dict) and entry.get("best_over_cublas", 9) < 0.95 and entry.get("best_row_exact")}
    if not chosen:
        return {"chosen": {}, "note": "no tile beat cuBLAS by 5%"}
    return _backend_with(loaded, chosen, fused=False)


def _backend_with(loaded: Any, chosen: dict[str, Any], fused: bool, pdl: str = "off") -> dict[str, Any]:
    """The backend with `chosen` tiles: passes of 1, 2, 32 and 64 rows at 512 keys (host
    wall ms) and its rows against its decode steps."""
    from codespec.forward.cuda import CudaForward

    forward = CudaForward(loaded.model, tiles=chosen, fused=fused, pdl=pdl)
    ms = pass_ms(loaded, forward, (1, 2, 32, 64))
    swapped = loaded.forward
    loaded.forward = forward
    try:
        rows = row_checks(loaded)
    finally:
        loaded.forward = swapped
    return {"chosen": {k: v.__dict__ for k, v in chosen.items()}, "ms_per_pass_512": ms, **rows}


def fused_probe(loaded: Any) -> dict[str, Any]:
    """The backend with fused layers (CODESPEC_CUDA_FUSED: every product through
    row_linear with the norm, SiLU and residual inside): its rows against its decode
    steps, the pass-cost curve and the step's kernels, beside the default backend's."""
    from codespec.forward.cuda import CudaForward

    forward = CudaForward(loaded.model, fused=True)
    default = loaded.forward
    loaded.forward = forward
    try:
        return {"tiles": {name: tile.__dict__ for name, tile in forward.tiles.items()}, **row_checks(loaded),
                **cost_curve(loaded), "profile": profile_step(loaded)}
    finally:
        loaded.forward = default


# The fused products' operands (forward/cuda_fused.py's fused_layers): what each product
# carries besides x @ W.T (the norms take the sums of squares o and down leave).
_FUSION = {"qkv": ("norm", "squares", "bias", "rope"), "o": ("residual", "squares_out"),
           "gate_up": ("norm", "squares", "pairs"), "down": ("residual", "squares_out"),
           "lm_head": ("norm", "squares", "choices")}


@torch.inference_mode()
def fused_tiles_probe(loaded: Any, budget_s: float = 60.0, block_m: int = 64, live_rows: int | None = None,
                      pdl: str = "off") -> dict[str, Any]:
    """Each fused product (what it carries: _FUSION) by tile, us per call in CUDA
    graphs at the bucket's 64 rows, against forward/cuda_fused.py's FUSED_TILES (chosen from
    the products alone); then the fused backend with each product's fastest tile where it
    beats FUSED_TILES by 3%: its passes and its rows against its decode steps. `block_m`
    rows a program (CODESPEC_CUDA_TILE_ROWS), `live_rows` of the 64 holding a token (1:
    a step; None: every row, without row_linear's `live` but for q/k/v, whose rotary
    stores K and V for the rows that hold a token), `pdl` its launch (the `fusedtiles16`
    stage: 16-row programs, a step's one row, PDL warming the weights). q/k/v's tiles
    that cut a head fail (rotary needs whole heads), as the backend would refuse them."""
    from dataclasses import replace

    from codespec.forward.base import kv_dims
    from codespec.forward.cuda_fused import FUSED_TILES, whole_heads
    from codespec.kernels.row_linear import Config, Rope, row_linear

    _, kv_heads, dim = kv_dims(loaded.model.config)
    heads = loaded.model.config.num_attention_heads

    model = loaded.model
    products = _products(model)
    result: dict[str, Any] = {}
    chosen: dict[str, Config] = {}
    for name, (weight, bias) in products.items():
        began = time.perf_counter()
        n_size, k_size = weight.shape
        fusion = _FUSION[name]
        like = dict(device=weight.device, dtype=weight.dtype)
        x = torch.randn(64, k_size, **like)
        kwargs: dict[str, Any] = {"pairs": "pairs" in fusion}
        if "norm" in fusion:
            kwargs["norm"] = (torch.randn(k_size, **like), 1e-6)
        if "squares" in fusion:  # as down leaves them (FUSED_TILES: 32 outputs a block)
            kwargs["squares"] = torch.rand(64, k_size // 32, device=weight.device)
        if "residual" in fusion:
            kwargs["residual"] = torch.randn(64, n_size, **like)
        out = torch.empty(64, n_size // 2 if kwargs["pairs"] else n_size, **like)
        if live_rows is not None or "rope" in fusion:
            context = torch.zeros(64, dtype=torch.int64, device=weight.device)
            context[:64 if live_rows is None else live_rows] = 512
            kwargs.update(live=(context, torch.zeros_like(context)), pdl=pdl)
        if "rope" in fusion:  # rows at positions 512.., K and V into a slot of 1,024
            at = 512 + torch.arange(64, device=weight.device)
            table = torch.randn(1024, dim, **like)
            cache = [torch.zeros(1, kv_heads, 1024, dim, **like) for _ in range(2)]
            kwargs["rope"] = Rope(table.cos(), table.sin(), at, torch.arange(64, device=weight.device),
                                  torch.zeros_like(at), at, *cache, heads, kv_heads)
            out = torch.empty(64, heads * dim, **like)
        if "choices" in fusion:
            kwargs["choices"] = torch.empty(64, dtype=torch.int64, device=weight.device)
        squares_out: dict[int, torch.Tensor] = {}  # by block_n, allocated before any capture

        def run(c: Config, fusion: tuple[str, ...] = fusion, weight: torch.Tensor = weight,
                bias: torch.Tensor | None = bias, x: torch.Tensor = x, out: torch.Tensor = out,
                kwargs: dict[str, Any] = kwargs, squares_out: dict[int, torch.Tensor] = squares_out) -> Any:
            if "squares_out" in fusion:
                kwargs = {**kwargs, "squares_out": squares_out.setdefault(
                    c.block_n, torch.empty(64, weight.shape[0] // c.block_n, device=weight.device))}
            return row_linear(x, weight, bias if "bias" in fusion else None, config=c, out=out, **kwargs)

        default = replace(FUSED_TILES[name], block_m=block_m)
        default = (whole_heads(default, dim, kv_heads) if name == "qkv" else default).fitted(64, n_size, k_size)
        entry: dict[str, Any] = {"fusion": list(fusion), "floor_us": round(weight.numel() * 2 / 2.98e12 * 1e6, 2),
                                 "default": default.__dict__, "default_us": _graph_us(lambda: run(default))}
        swept = _tile_sweep(name, n_size, k_size, run, began + budget_s / len(products), warps=(4, 8),
                            block_m=block_m)
        entry["tiles_us"] = timed = {key: us for key, (_, us) in swept.items()}
        best, config = _best(swept)
        if best is not None:
            entry.update(best=best, best_config=config.__dict__,
                         best_over_default=round(timed[best] / entry["default_us"], 3))
            if timed[best] < 0.97 * entry["default_us"]:
                chosen[name] = config
        result[name] = entry
    layers = len(model.model.layers)
    saved = sum((result[n]["default_us"] - result[n]["default_us"] * result[n]["best_over_default"])
                * (1 if n == "lm_head" else layers) for n in chosen)
    result["chosen"] = {name: config.__dict__ for name, config in chosen.items()}
    result["predicted_saving_us_per_step"] = round(saved, 1)
    if chosen:
        result["backend"] = _backend_with(loaded, chosen, fused=True, pdl=pdl)
    return result


def _tile_sweep(name: str, n_size: int, k_size: int, run: Any, deadline: float,
                warps: tuple[int, ...] = (4,), block_m: int = 64) -> dict[str, tuple[Any, Any]]:
    """row_linear tiles (`block_m` rows a program) for one product at the bucket's 64
    rows, until `deadline` (perf_counter): key -> (Config, us per call in CUDA graphs, or
    why it failed)."""
    from codespec.kernels.row_linear import Config

    swept: dict[str, tuple[Any, Any]] = {}
    widths = (64, 128, 256) if name == "lm_head" else (16, 32, 64, 128)
    for block_n in widths:
        for block_k in (64, 128, 256):
            steps, programs = k_size // block_k, n_size // block_n
            if k_size % block_k or n_size % block_n:
                continue
            for splits in (1, 2, 4, 8):
                if splits > steps or (splits > 1 and (programs * splits > 4 * 132 or programs >= 264)):
                    continue
                for num_warps in warps if block_n >= 64 else warps[:1]:
                    if time.perf_counter() > deadline:
                        return swept
                    config = Config(block_m=block_m, block_n=block_n, block_k=block_k, splits=splits,
                                    num_warps=num_warps, num_stages=3 if block_k * block_n >= 256 * 64 else 4)
                    key = f"{block_n}x{block_k}/{splits}/w{num_warps}"
                    try:
                        swept[key] = (config, _graph_us(lambda c=config: run(c)))
                    except Exception as error:  # a tile the device cannot run: say so, go on
                        swept[key] = (config, f"{type(error).__name__}: {str(error)[:100]}")
    return swept


def _best(swept: dict[str, tuple[Any, Any]]) -> tuple[str | None, Any]:
    """The fastest tile's key and Config (None, None when none ran)."""
    timed = {key: us for key, (_, us) in swept.items() if isinstance(us, float)}
    if not timed:
        return None, None
    best = min(timed, key=timed.get)
    return best, swept[best][0]


def bucket_probe(loaded: Any, sizes: tuple[int, ...] = (16, 32)) -> dict[str, Any]:
    """The bucket's size (CODESPEC_CUDA_ROWS) against the plain step, the one bar the
    H100 runs missed (1.45 ms, 4.3x the weights' read time, with 64 rows). A smaller
    bucket runs every product and attention grid on fewer rows, which cuBLAS may tile
    better, but a pass of more rows than the bucket replays it again (the 32-row pass's
    bar needs a bucket of at least 32). Per size: median ms per pass by rows at 512 keys,
    the step over the floor, its rows against its decode steps, the step's kernels."""
    from codespec.forward.cuda import CudaForward

    default, floor = loaded.forward, step_floor(loaded)
    result: dict[str, Any] = {**floor}
    try:
        for rows in sizes:
            began = time.perf_counter()
            loaded.forward = forward = CudaForward(loaded.model, rows=rows)
            curve = pass_ms(loaded, forward, sorted({1, rows // 2, rows, 32, 64}))
            profile = profile_step(loaded)
            result[str(rows)] = {"ms_per_pass_512": curve, "step_over_floor": round(curve[1] / floor["floor_ms"], 2),
                                 "ratio_32_rows_to_1": round(curve[32] / curve[1], 3), **row_checks(loaded),
                                 "kernels_per_step": profile.get("kernels_per_step"),
                                 "gpu_busy_ms_per_step": profile.get("gpu_busy_ms_per_step"),
                                 "top_kernels": profile.get("top", [])[:8],
                                 "seconds": round(time.perf_counter() - began, 1)}
            del forward
            loaded.forward = default
            torch.cuda.empty_cache()
    finally:
        loaded.forward = default
    return result

