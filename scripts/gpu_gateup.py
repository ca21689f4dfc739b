"""The `gateup` stage of scripts/gpu_check.py (2026-11-28): why the fused layers' gate/up
takes twice its bytes.

The 2026-11-28 H200 trace: gate/up is 26% of a five-launch step (10.9 us a layer), its K
loop alone 10.2 us for 17.4 MB (3.6 us at 4.8 TB/s), though its weights were warmed into
L2 while o ran. Bare, the same product in row_linear took 6.4 us on the H100
(the 2026-11-26 `gemm` probe, cuBLAS 6.5, bytes 5.9). What the fused one adds: 16-row programs, the
norm from the sums of squares, the SiLU pairs' epilogue, PDL and the warming. Here each
is taken away in turn (and the tile's warps, pipeline depth, K step and a two-way split
folded tried), each variant timed in CUDA graphs of the 24 layers' weights in turn
(`cold_us`: nothing of the next layer's in L2 but what its own warming brought) and of
layer 0's 24 times (`hot_us`: in L2), us a call, for a step's one live row of 64; with
cuBLAS's bare product beside them. The variant whose removal closes most of the gap
names the cause."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any, Callable

import torch

from gpu_measure import _graph_us
from gpu_step import NO_CANDIDATES

ROWS = 64  # the bucket
# Each variant: what it changes from the fused layers' gate/up (forward/cuda_fused.py's
# FUSED_TILES at 16-row programs, norm from squares, pairs, PDL warming its weights).
VARIANTS: dict[str, dict[str, Any]] = {
    "fused": {},
    "no warming": {"pdl": "launch"},
    "no pdl": {"pdl": "off"},
    "no norm": {"norm": False},
    "no pairs": {"pairs": False},
    "bare": {"norm": False, "pairs": False, "pdl": "off"},
    "64-row programs": {"block_m": 64},
    "4 warps": {"num_warps": 4},
    "2 stages": {"num_stages": 2},
    "4 stages": {"num_stages": 4},
    "K step 64": {"block_k": 64, "num_stages": 4},
    "K step 256": {"block_k": 256, "num_stages": 2},
    "64 outputs": {"block_n": 64},
    # 2026-11-28: every SM a program or more (608 and 304 of them), at two warps: at four, the
    # norm's weight is a plain load each K step (so is `4 warps` above: read it with that)
    "16 outputs, 2 warps": {"block_n": 16, "num_warps": 2, "num_stages": 4},
    "32 outputs, 2 warps": {"block_n": 32, "num_warps": 2, "num_stages": 4},
    # ... and with a tile more in flight: if a program's own copies in flight set its rate
    # (not the SM's), this one gains over the 4 stages above (5 x ~41 KB of shared memory
    # still fits the ~5 programs an SM of 608)
    "16 outputs, 2 warps, 5 stages": {"block_n": 16, "num_warps": 2, "num_stages": 5},
    "split 2, folded": {"splits": 2},
}


def gateup_probe(loaded: Any) -> dict[str, Any]:
    """Each VARIANT's gate/up, cold and hot (module docstring), and cuBLAS's bare product;
    a variant a device or this Triton refuses reports why and the rest go on."""
    from codespec.forward.cuda_fused import FUSED_TILES
    from codespec.kernels.row_linear import row_linear

    layers = [layer for layer in loaded.forward._layers]
    weight = layers[0].gate_up
    n_size, k_size = weight.shape
    like = dict(device=weight.device, dtype=weight.dtype)
    x = torch.randn(ROWS, k_size, **like)
    squares = torch.rand(ROWS, k_size // 32, device=weight.device)  # as down leaves them (32 outputs a block)
    context = torch.zeros(ROWS, dtype=torch.int64, device=weight.device)
    context[0] = 512  # a step: one row holds a token
    live = (context, torch.zeros_like(context))
    counts = torch.zeros(n_size // 16 * (ROWS // 16), dtype=torch.int32, device=weight.device)
    outs = {pairs: torch.empty(ROWS, n_size // 2 if pairs else n_size, **like) for pairs in (True, False)}
    base = replace(FUSED_TILES["gate_up"], block_m=16)
    result: dict[str, Any] = {"mb": round(weight.numel() * weight.element_size() / 2**20, 2),
                              "tile": base.__dict__}

    def call(change: dict[str, Any]) -> Callable[[Any], Any]:
        own = {"norm": True, "pairs": True, "pdl": "prefetch", **change}
        config = replace(base, **{k: v for k, v in own.items() if k in base.__dict__}).fitted(ROWS, n_size, k_size)
        norm, pairs = own["norm"], own["pairs"]

        def run(layer: Any) -> Any:
            return row_linear(x, layer.gate_up, norm=(layer.post_norm, layer.post_eps) if norm else None,
                              squares=squares if norm else None, pairs=pairs, config=config, out=outs[pairs],
                              live=live, pdl=own["pdl"], counts=counts if config.splits > 1 else None)
        return run

    for name, change in VARIANTS.items():
        if change.get("num_warps") == 2 and os.environ.get(NO_CANDIDATES):  # the smoke's gate/up tile failed
            result[name] = {"error": "skipped: the smoke stage found the candidates failing (gpu_smoke.py)"}
            continue
        try:
            run = call(change)
            result[name] = {"cold_us": round(_graph_us(lambda: [run(layer) for layer in layers], calls=1)
                                             / len(layers), 2),
                            "hot_us": round(_graph_us(lambda: [run(layers[0]) for _ in layers], calls=1)
                                            / len(layers), 2)}
        except Exception as error:  # a variant the device or this triton refuses: say so, go on
            result[name] = {"error": f"{type(error).__name__}: {str(error)[:200]}"}
    one = x[:1]
    result["cublas one row"] = {
        "cold_us": round(_graph_us(lambda: [torch.nn.functional.linear(one, layer.gate_up) for layer in layers],
                                   calls=1) / len(layers), 2),
        "hot_us": round(_graph_us(lambda: [torch.nn.functional.linear(one, layers[0].gate_up) for _ in layers],
                                  calls=1) / len(layers), 2)}
    result["counts_left_zero"] = not bool(counts.any())
    return result
