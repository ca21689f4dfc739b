"""Time marks inside the cuda backend's kernels: where a product's microseconds go
(kernels/trace.py reads them; scripts/gpu_trace.py's `trace` stage).

Why. An H100 run (2026-11-27) cut a step from 273 launches to 125 and saved ~20 us of
1.2 ms: launches were not the cost, and no profiler says what is. Each program of a
traced launch writes the time at a few points of its own work, PHASES of them, into its
row of a region the tracer gave that launch: when it started, when the kernel before had
ended (after `pdl_wait`), when its products were summed, when a split's sum was done,
when it stored its last output. Every point is a store of one value by one program, not
a synchronisation: a traced kernel computes what it computes untraced.

Two clocks (`CLOCK`): on a GPU `%globaltimer`, nanoseconds common to every SM (32 ns
steps on Hopper), and at the start the SM the program runs on (`%smid`:
whether the busiest SM's bytes set a product's time); under the interpreter, which cannot run inline PTX and runs programs
one after another, a logical clock: one shared counter, incremented at each mark, so the
tests see the marks' order. CLOCK=0 (untraced) compiles every mark away."""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl

from codespec.kernels._triton_pdl import pdl_start, pdl_wait_for
from codespec.kernels.flags import TakeFlag, flagged
from codespec.kernels.trace import COLUMNS, PHASES, SM_COLUMN, UNTRACED, TakeTrace, Trace

# each mark's place in a program's row (kernels/trace.py's PHASES)
START, WAITED, COMPUTED, REDUCED, ENDED = (tl.constexpr(PHASES.index(name)) for name in
                                           ("start", "waited", "computed", "reduced", "ended"))
_MARKS = tl.constexpr(COLUMNS)
_SM = tl.constexpr(SM_COLUMN)


@triton.jit
def _now(clock_ptr, CLOCK: tl.constexpr):
    if CLOCK == 1:
        return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False,
                                         pack=1)
    else:
        return tl.atomic_add(clock_ptr, 1) + 1


@triton.jit
def trace_mark(trace_ptr, clock_ptr, program, PHASE: tl.constexpr, CLOCK: tl.constexpr):
    # This program's time at PHASE into its row of the launch's region (nothing untraced);
    # at its start on a GPU, also the SM it runs on, plus one (0: not known).
    if CLOCK != 0:
        tl.store(trace_ptr + program * _MARKS + PHASE, _now(clock_ptr, CLOCK))
        if CLOCK == 1:
            if PHASE == 0:
                sm = tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=True, pack=1)
                tl.store(trace_ptr + program * _MARKS + _SM, sm.to(tl.int64) + 1)


@triton.jit
def waited_program(trace_ptr, clock_ptr, flags_ptr, launch, before, PDL: tl.constexpr, FLAGS: tl.constexpr,
                   CLOCK: tl.constexpr):
    # A program with nothing to do before its wait: its start marked, its dependents let
    # start, the kernel before waited for (kernels/_triton_pdl.py), that marked; its row
    # in the launch's region.
    program = program_index()
    trace_mark(trace_ptr, clock_ptr, program, START, CLOCK)
    pdl_start(PDL)
    pdl_wait_for(flags_ptr, launch, before, PDL, FLAGS)
    trace_mark(trace_ptr, clock_ptr, program, WAITED, CLOCK)
    return program


@triton.jit
def program_index():
    # The program's row in its launch's region: its grid coordinates, axis 0 fastest.
    return tl.program_id(0) + tl.num_programs(0) * (tl.program_id(1) + tl.num_programs(1) * tl.program_id(2))


def traced(trace: Trace | None, placeholder: Any) -> tuple[Any, Any]:
    """A launch's trace and clock pointers: the region's and the clock's, or (untraced,
    CLOCK=0 compiles the marks away) any tensor of the launch's."""
    return (trace.region, trace.clock) if trace is not None else (placeholder, placeholder)


def launch_hooks(trace: TakeTrace | None, flags: TakeFlag | None, part: str, programs: int,
                 placeholder: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A launch of `programs` programs' trace and count arguments (trace_ptr, clock_ptr,
    flags_ptr, launch, before: the region and place it takes, kernels/trace.py and
    kernels/flags.py) and their constants (CLOCK, FLAGS; none taken: 0 and off)."""
    region = trace(part, programs) if trace is not None else None
    flag = flags(programs) if flags is not None else None
    return (*traced(region, placeholder), *flagged(flag, placeholder)), {
        "CLOCK": region.kind if region is not None else UNTRACED, "FLAGS": flag is not None}
