"""Warm the GPU's L2 cache with weights a later kernel will read (forward/prefetch.py).

Why. A decode step of the default model on an H100 spends ~0.73 ms in products whose
weights would take 0.3 ms to read at HBM bandwidth: each small product is latency-bound,
and between products (norms, rotary, attention) the memory system idles. A kernel on a
side stream can pull the next products' weights into L2 (50 MB on an H100; a layer of
the default model is ~28 MB) during that idle time, so cuBLAS reads them from L2. It is a
cache hint: no value a pass computes changes, so rows stay exact (what the GPU check's
`prefetch` stage measures is whether it pays).

Modes (what one lane issues for its `grain` bytes):
* `sector`: `prefetch.global.L2` on the grain's address (32-byte sectors by default);
* `bulk`: Hopper's `cp.async.bulk.prefetch.L2` for the whole grain (sm_90 and later);
* `load`: a byte of every grain loaded past L1 and summed into a scratch word: any GPU,
  and the mode the CPU tests run under `TRITON_INTERPRET=1` (no inline PTX there).

Each launch takes up to four regions (flat byte views of contiguous tensors) and writes
one word per program into `sink` (the only write: it keeps the compiler from dropping
the loads). The reference is doing nothing, which is also what CPU tensors get.

>>> weights = [torch.ones(64, 32), torch.ones(32)]
>>> l2_prefetch(weights, torch.zeros(2, dtype=torch.int32), mode="sector")   # CPU: nothing to warm
"""

from __future__ import annotations

import torch

from codespec.kernels import check, use_triton

MODES = ("sector", "bulk", "load")
GRAIN = {"sector": 32, "bulk": 16384, "load": 32}  # bytes a lane covers
BLOCK = 512  # lanes a program issues at a time


def l2_prefetch(tensors: list[torch.Tensor], sink: torch.Tensor, *, mode: str, grain: int | None = None,
                force_triton: bool | None = None) -> None:
    """Queue the warming of `tensors` on the current stream, over `sink.numel()` programs."""
    check(mode in MODES, f"prefetch mode {mode!r}: expected one of {', '.join(MODES)}")
    check(1 <= len(tensors) <= 4, "one launch warms one to four tensors")
    check(all(t.is_contiguous() and t.device == sink.device for t in tensors),
          "tensors must be contiguous and on the sink's device")
    check(sink.dtype == torch.int32 and sink.dim() == 1 and sink.numel() >= 1, "sink must be [programs] int32")
    grain = grain or GRAIN[mode]
    check(grain >= 16 and grain % 16 == 0, "grain must be a multiple of 16 bytes")
    regions = [t.view(-1).view(torch.uint8) for t in tensors]
    check(all(r.numel() < 2**31 for r in regions), "a region must hold fewer than 2**31 bytes")
    if mode == "bulk":
        check(all(r.numel() % 16 == 0 and r.data_ptr() % 16 == 0 for r in regions),
              "bulk prefetch needs 16-byte aligned regions whose sizes are multiples of 16 bytes")
    if use_triton(sink, force_triton):
        from codespec.kernels import _triton_prefetch

        _triton_prefetch.l2_prefetch(regions, sink, mode, grain, BLOCK)
