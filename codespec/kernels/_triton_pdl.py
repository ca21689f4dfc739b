"""Programmatic dependent launch (PDL, sm_90 and later) for the cuda backend's Triton
kernels: `CODESPEC_CUDA_PDL` (forward/cuda_settings.py).

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

`pdl_wait_for` and `pdl_done` (CODESPEC_CUDA_PDL=flags, kernels/flags.py): the
same launches waiting on a count each program of the launch before raises after its
stores, instead of on that launch's end."""

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


# A counted launch's place (kernels/flags.py), runtime integers every launch of a pass
# passes differently: Triton would compile a kernel again for each divisibility by 16
# (and for 1) it saw, several builds of each product on the GPU machine, ~2 s each.
COUNTED = ["launch", "before"]
# Reads of a launch's count before a program gives up on it (~1 us each: seconds). Only a
# bug gets there: every program it waits for has started (kernels/flags.py).
FLAG_SPIN_LIMIT = tl.constexpr(1 << 22)


@triton.jit
def pdl_wait_for(counts_ptr, launch, before, PDL: tl.constexpr, FLAGS: tl.constexpr):
    # Wait for the kernel before (kernels/flags.py): its end and its writes visible
    # (`pdl_wait`), or with FLAGS every one of its `before` programs' count, which each
    # raised after its stores (counts_ptr[launch - 1], read with acquire at GPU scope); a
    # count still short after FLAG_SPIN_LIMIT reads is recorded in counts_ptr[0].
    if FLAGS:
        count_ptr = counts_ptr + launch - 1
        wait_count(count_ptr, tl.atomic_add(count_ptr, 0, sem="acquire", scope="gpu"), before, counts_ptr,
                   FLAG_SPIN_LIMIT)
    else:
        pdl_wait(PDL)


@triton.jit
def wait_count(count_ptr, seen, target, error_ptr, SPIN_LIMIT: tl.constexpr):
    # Read the count from `seen` on (acquire at GPU scope: what the programs that raised
    # it stored is visible after) until it reaches `target`, SPIN_LIMIT reads at most; one
    # that stays short raises *error_ptr and goes on (wrong numbers, never a hung GPU).
    spins = 0
    while (seen < target) & (spins < SPIN_LIMIT):
        seen = tl.atomic_add(count_ptr, 0, sem="acquire", scope="gpu")
        spins += 1
    if seen < target:
        tl.atomic_max(error_ptr, 1, sem="relaxed", scope="gpu")
    tl.debug_barrier()


@triton.jit
def pdl_done(counts_ptr, launch, FLAGS: tl.constexpr):
    # With FLAGS, after the program's last store: every thread's stores, then its count
    # (release at GPU scope: the next launch's acquire sees them).
    if FLAGS:
        tl.debug_barrier()
        tl.atomic_add(counts_ptr + launch, 1, sem="release", scope="gpu")


def launch_options(pdl: bool, fp_fusion: bool = True) -> dict[str, bool]:
    """Triton's options for each launch of the cuda backend's kernels: launched as a
    programmatic dependent where `pdl`; `fp_fusion`, whether the compiler may fuse a
    multiply and an add into one rounding, pinned: Triton's default for it changes in
    3.10, and a kernel's arithmetic must not change with the version Triton happens to be
    (on: Triton 3.6's default, what the GPU check measured). A kernel that promises to
    round where transformers' eager code rounds turns it off: compiled for sm_90 with it
    on, rotary's `(x * cos).to(bf16) + ...` became one bf16 fma, the product unrounded."""
    return {"enable_fp_fusion": fp_fusion, **({"launch_pdl": True} if pdl else {})}
