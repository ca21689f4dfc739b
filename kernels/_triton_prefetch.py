"""The Triton kernel behind `l2_prefetch` (imported only when one runs: on CUDA tensors,
or on CPU under `TRITON_INTERPRET=1` in the tests, where only the `load` mode runs: the
interpreter cannot execute inline PTX).

The launcher takes arguments its wrapper already checked."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from codespec.kernels._triton_pdl import launch_options

MODES = {"load": 0, "sector": 1, "bulk": 2}


@triton.jit
def sector_prefetch(at, inside):
    # prefetch.global.L2 at each lane's address where `inside`: its sector comes into L2,
    # nothing returns to a register (the zeros returned keep the call in the program).
    return tl.inline_asm_elementwise("@$2 prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l,b", [at, inside],
                                     dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _region(ptr, nbytes, program, programs, MODE: tl.constexpr, GRAIN: tl.constexpr, BLOCK: tl.constexpr):
    # This program's share of one region, GRAIN bytes per lane and BLOCK lanes at a time;
    # returns what keeps the compiler from dropping the work (0 but for `load`'s sum).
    grains = tl.cdiv(nbytes, GRAIN)
    per = tl.cdiv(grains, programs)
    low = program * per
    high = tl.minimum(low + per, grains)
    kept = tl.zeros([BLOCK], tl.int32)
    for first in range(low, high, BLOCK):
        grain = first + tl.arange(0, BLOCK)
        inside = grain < high
        at = ptr + grain.to(tl.int64) * GRAIN
        if MODE == 0:
            # a byte of every GRAIN: the whole sector comes into L2 (.cg: not into L1)
            kept += tl.load(at, mask=inside, other=0, cache_modifier=".cg").to(tl.int32)
        elif MODE == 1:
            kept |= sector_prefetch(at, inside)
        else:
            # Hopper's bulk prefetch: the copy engine pulls GRAIN bytes per instruction
            size = tl.minimum(nbytes - grain.to(tl.int64) * GRAIN, GRAIN).to(tl.int32)
            kept |= tl.inline_asm_elementwise("@$3 cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0;",
                                              "=r,l,r,b", [at, size, inside], dtype=tl.int32, is_pure=False,
                                              pack=1)
    return kept


@triton.jit
def _l2_prefetch_kernel(p0, n0, p1, n1, p2, n2, p3, n3, sink_ptr, MODE: tl.constexpr, GRAIN: tl.constexpr,
                        BLOCK: tl.constexpr):
    # Every program takes its share of each of (up to) four regions, so one launch warms
    # a window's weights; unused regions have 0 bytes.
    program = tl.program_id(0)
    programs = tl.num_programs(0)
    kept = _region(p0, n0, program, programs, MODE, GRAIN, BLOCK)
    kept += _region(p1, n1, program, programs, MODE, GRAIN, BLOCK)
    kept += _region(p2, n2, program, programs, MODE, GRAIN, BLOCK)
    kept += _region(p3, n3, program, programs, MODE, GRAIN, BLOCK)
    tl.store(sink_ptr + program, tl.sum(kept, axis=0))  # one word a program: the work stays


def l2_prefetch(regions: list[torch.Tensor], sink: torch.Tensor, mode: str, grain: int, block: int) -> None:
    padded = [*regions, *[regions[0]] * (4 - len(regions))]
    sizes = [r.numel() for r in regions] + [0] * (4 - len(regions))
    args = [value for region, size in zip(padded, sizes) for value in (region, size)]
    _l2_prefetch_kernel[(sink.numel(),)](*args, sink, MODE=MODES[mode], GRAIN=grain, BLOCK=block,
                                         **launch_options(False))
