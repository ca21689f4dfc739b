"""Programmatic dependent launch (PDL, sm_90 and later) for the cuda backend's Triton
kernels: `CODESPEC_CUDA_PDL` (forward/cuda/settings.py).

Why. A plain step of the default model is ~280 kernels, and in a CUDA graph each one
starts only when the one before it has ended and its writes are out: the products are
latency-bound (a 2 MB product takes ~4 us on an H100 where its bytes take 0.7), and the
gaps between kernels were 0.19 ms of a 1.17 ms step (an H100 profile, 2026-11-26). Launched
with PDL, a kernel's programs start as soon as every program of the kernel before it has
started (each calls `pdl_start` first), run what reads no earlier kernel's output (the
products: warming their own weights into L2, which no pass writes), and then wait in
`pdl_wait` until the kernel before has ended and its memory is visible.

Exactness does not depend on it: every value is read after the wait, so every kernel
computes what it computes without PDL (the GPU check compares the bits). Ordering stays
transitive because every program of every PDL kernel waits before it ends: a kernel
ends only after the one before it did, so reading what any earlier kernel wrote, or
writing memory an earlier kernel read (the graph reuses buffers), is safe after the wait.

PDL=False (the interpreter, GPUs before Hopper, the setting off) compiles both calls away.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def pdl_start(PDL: tl.constexpr):
    # Let the next kernel's programs start (they wait for this one's end before they read).
    if PDL:
        gdc_launch_dependents()


@triton.jit
def pdl_wait(PDL: tl.constexpr):
    # Wait until the kernel before has ended and its writes are visible: before the first
    # read of anything a kernel writes, and in every program (the ordering's transitivity).
    if PDL:
        gdc_wait()


def launch_options(pdl: bool, fp_fusion: bool = True) -> dict[str, bool]:
    """Triton's options for each launch of the cuda backend's kernels: launched as a
    programmatic dependent where `pdl`; `fp_fusion`, whether the compiler may fuse a
    multiply and an add into one rounding, pinned: Triton's default for it changes in
    3.10, and a kernel's arithmetic must not change with the version Triton happens to be
    (on: Triton 3.6's default, what the GPU check measured). A kernel that promises to
    round where transformers' eager code rounds turns it off: compiled for sm_90 with it
    on, rotary's `(x * cos).to(bf16) + ...` became one bf16 fma, the product unrounded."""
    return {"enable_fp_fusion": fp_fusion, **({"launch_pdl": True} if pdl else {})}
