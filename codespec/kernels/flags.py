"""Launches that wait on counts, not on the launch before's end (CODESPEC_CUDA_PDL=flags,
kernels/_triton_pdl.py's `pdl_wait_for` and `pdl_done`).

Why. With programmatic dependent launch a kernel's programs start early and wait in
`griddepcontrol.wait` until the kernel before has ended and its memory is flushed: a
launch boundary, ~120 of them in a fused step. Here every program of a launch instead,
after its last store and a CTA barrier, raises its launch's count (release at GPU
scope), and the next launch's programs read that count (acquire) until every program
before has raised it. PDL still launches a kernel only once every program of the one
before has started, so programs that spin never keep the ones they wait for from
running; and release/acquire chains are transitive, so what any earlier launch wrote is
visible too, and what it read is read before anything later writes over it.

A pass's counts start at zero (a memset in its CUDA graph, before the first launch); a
count that stays short after `FLAG_SPIN_LIMIT` reads (only a bug gets there) is
recorded in the pass's error word, `counts[0]`, and the program goes on: the GPU check
reads it (`errors`).

>>> flags = PassFlags(torch.device("cpu"))
>>> flags.begin()
>>> first, second = flags.take(4), flags.take(6)
>>> (first.launch, first.before), (second.launch, second.before)
((1, 0), (2, 4))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

LAUNCHES = 1024  # a pass's launches at most: a fused step of the default model is ~125-200


@dataclass(frozen=True)
class Flag:
    """One launch's place among the pass's counts."""

    counts: torch.Tensor  # int32 [1 + LAUNCHES]: [0] the error word, [i] launch i's finished programs
    launch: int  # this launch's count (from 1)
    before: int  # the programs of the launch before (0 for the first: nothing to wait for)


TakeFlag = Callable[[int], Flag]  # (the launch's programs) -> its place


class PassFlags:
    """The counts of a pass's launches, handed out in launch order."""

    def __init__(self, device: torch.device) -> None:
        self.counts = torch.zeros(1 + LAUNCHES, dtype=torch.int32, device=device)
        self.programs: list[int] = []  # the last pass's launches' programs: what their counts reach

    def begin(self) -> None:
        """A pass starts: its counts (and error word) back to zero, on the device in its
        order (in a CUDA graph, a memset before the first launch)."""
        self.counts.zero_()
        self.programs = []

    def take(self, programs: int) -> Flag:
        """The next launch's place: it waits on the launch before's count, raises its own."""
        if len(self.programs) >= LAUNCHES:
            raise RuntimeError(f"a pass of more than {LAUNCHES} launches waiting on counts")
        flag = Flag(self.counts, len(self.programs) + 1, self.programs[-1] if self.programs else 0)
        self.programs.append(programs)
        return flag

    def errors(self) -> int:
        """Whether a launch of the last pass gave up waiting for its count (0: none did)."""
        return int(self.counts[0])


def flagged(flag: Flag | None, placeholder: Any) -> tuple[Any, int, int]:
    """A launch's counts pointer, its index and the programs it waits for: the flag's, or
    (no flags: FLAGS=0 compiles the waits away) any tensor of the launch's."""
    return (flag.counts, flag.launch, flag.before) if flag is not None else (placeholder, 0, 0)
