"""Where a pass's time goes, launch by launch and inside each program: the cuda backend's
fused layers traced (CudaForward(model, trace=True); scripts/gpu_step.py's `trace`
stage reads a step's timeline on the GPU).

Each traced launch gets a region from the Tracer, [programs, PHASES] int64, and each of
its programs writes its clock at each phase it reaches (kernels/_triton_trace.py); zero
is a phase it never reached (a block of padding rows computes nothing, a split that is
not its block's last sums nothing). A pass launches the same kernels in the same order
every time (its shapes are the bucket's), so the regions are handed out in launch order
on the first pass and again to every later one: a CUDA graph captures their addresses.
A backend with two layouts (a graph for steps, another for wide passes) names the one a
pass runs (`begin(layout)`): each keeps its own regions.

`timeline` reads the regions after a pass: for each launch, when its first program
started against when the launch before ended (`lead`; negative: it started early, as
programmatic dependent launch allows), when its first program got past its wait
(`release`: what ending a launch and releasing its dependents costs), when its last
program ended, and its share of the pass (its end minus the end before: the shares add
up to the pass), with the phases of its program that ended last (the one the next launch
waited for) and the medians over its programs. `summary` gathers the launches of each kind (a label's part before the
dot: qkv, attention, ...).

>>> import torch
>>> a = torch.tensor([[10, 12, 15, 0, 16], [11, 12, 14, 0, 18]])   # two programs
>>> b = torch.tensor([[17, 19, 21, 0, 22]])
>>> line = timeline([("qkv.0", a), ("o.0", b)], unit=1.0)
>>> [(step["label"], step["share"], step["lead"], step["release"]) for step in line["launches"]]
[('qkv.0', 8.0, 0.0, 2.0), ('o.0', 4.0, -1.0, 1.0)]
>>> line["launches"][0]["last_program"]
{'waited': 1.0, 'computed': 2.0, 'ended': 4.0}
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Callable

import torch

PHASES = ("start", "waited", "computed", "reduced", "ended")  # a program's marks, in its region's row
# After the marks, the SM a program ran on, plus one (0: not known; %smid on a GPU)
SM_COLUMN = len(PHASES)
COLUMNS = SM_COLUMN + 1
UNTRACED, GLOBALTIMER, LOGICAL = 0, 1, 2  # the kernels' CLOCK: none, %globaltimer (ns), a shared counter


@dataclass(frozen=True)
class Trace:
    """One launch's region and the clock its programs read (what a traced kernel takes)."""

    region: torch.Tensor  # [programs, len(PHASES)] int64, on the kernel's device
    clock: torch.Tensor  # [1] int64: the logical clock's counter (unread with GLOBALTIMER)
    kind: int  # GLOBALTIMER or LOGICAL


# What a traced wrapper takes its launches' regions from: (the launch's part of the
# kernel's work, "" for its main launch; its programs) -> its region.
TakeTrace = Callable[[str, int], Trace]


class Tracer:
    """Regions for a pass's launches, handed out in launch order (module docstring). On
    a CUDA device the kernels read %globaltimer (ns); elsewhere (the interpreter) the
    logical clock, whose ticks order the marks."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.kind = GLOBALTIMER if device.type == "cuda" else LOGICAL
        self.clock = torch.zeros(1, dtype=torch.int64, device=device)
        self._layouts: dict[Any, list[tuple[str, torch.Tensor]]] = {}
        self.regions = self._layouts.setdefault(None, [])  # (label, region) in launch order
        self._next = 0

    def begin(self, layout: Any = None) -> None:
        """A pass of `layout` starts: its launches take that layout's regions from the
        first again."""
        self.regions = self._layouts.setdefault(layout, [])
        self._next = 0

    def take(self, label: str, programs: int) -> Trace:
        """The next launch's region: `programs` rows, named `label`."""
        if self._next < len(self.regions):
            known, region = self.regions[self._next]
            if known != label or region.shape[0] != programs:
                raise RuntimeError(f"a traced pass launched {label} ({programs} programs) where the first launched "
                                   f"{known} ({region.shape[0]}): trace one layout per Tracer")
        else:
            region = torch.zeros(programs, COLUMNS, dtype=torch.int64, device=self.device)
            self.regions.append((label, region))
        self._next += 1
        return Trace(region, self.clock, self.kind)

    def launches(self, kind: str, index: int | None = None) -> TakeTrace:
        """What a wrapper takes its launches' regions from, labelled kind[part][.index]."""
        suffix = "" if index is None else f".{index}"
        return lambda part, programs: self.take(f"{kind}{part}{suffix}", programs)

    @property
    def labels(self) -> list[str]:
        return [label for label, _ in self.regions]

    def clear(self) -> None:
        """Every mark of every layout back to zero (before the pass to read)."""
        with torch.inference_mode():  # the regions were made in a pass's
            for regions in self._layouts.values():
                for _, region in regions:
                    region.zero_()
            self.clock.zero_()

    def timeline(self, layout: Any = None) -> dict[str, Any]:
        """The timeline of the last pass of `layout` (the caller synchronised the device),
        in microseconds on a GPU, in ticks of the logical clock elsewhere. A graph's replay
        runs no Python, so `begin` cannot say which layout ran last: the caller does."""
        unit = 1e-3 if self.kind == GLOBALTIMER else 1.0
        return timeline([(label, region.cpu()) for label, region in self._layouts.get(layout, [])], unit)


def timeline(regions: list[tuple[str, torch.Tensor]], unit: float) -> dict[str, Any]:
    """Each launch of `regions` ([programs, PHASES] marks, 0 where none), in `unit` per
    clock tick (module docstring); `total` from the first start to the last end."""
    marked = [region[region[:, 0] > 0] for _, region in regions]
    if not any(len(rows) for rows in marked):
        return {"launches": [], "total": 0.0}
    origin = min(int(rows[:, 0].min()) for rows in marked if len(rows))
    previous_end = origin
    launches = []
    for (label, _), rows in zip(regions, marked):
        if not len(rows):
            launches.append({"label": label, "programs": 0})
            continue
        ends = rows[:, PHASES.index("ended")]
        end = int(ends.max())
        first = int(rows[:, 0].min())
        waited = rows[:, PHASES.index("waited")]
        released = int(waited[waited > 0].min()) if (waited > 0).any() else first
        durations = [_durations(row) for row in rows.tolist()]
        medians = {phase: round(statistics.median(d[phase] for d in durations if phase in d) * unit, 3)
                   for phase in PHASES[1:] if any(phase in d for d in durations)}
        launches.append({"label": label, "programs": len(rows), "lead": round((first - previous_end) * unit, 3),
                         "release": round((released - previous_end) * unit, 3),
                         "end": round((end - origin) * unit, 3), "share": round((end - previous_end) * unit, 3),
                         "last_program": {phase: round(value * unit, 3) for phase, value in
                                          _durations(rows[int(ends.argmax())].tolist()).items()},
                         "median_program": medians, **_per_sm(rows, unit), **_idle(rows, unit)})
        previous_end = max(previous_end, end)
    return {"launches": launches, "total": round((previous_end - origin) * unit, 3)}


def _per_sm(rows: torch.Tensor, unit: float) -> dict[str, Any]:
    """How a launch's working programs (those that computed: rows past their wait with a
    `computed` mark) shared the SMs, where the marks say which SM each ran on: how many
    SMs, the most on one, and the median time in the K loop (`computed`) of the programs
    alone on their SM and of those sharing it. If an SM's programs share a fixed rate,
    the sharing ones take longer by their number (how an H200 trace
    reads); if each program has its own, they do not."""
    if rows.shape[1] <= SM_COLUMN or not bool((rows[:, SM_COLUMN] > 0).any()):
        return {}
    computed, waited = PHASES.index("computed"), PHASES.index("waited")
    working = rows[(rows[:, computed] > 0) & (rows[:, SM_COLUMN] > 0)]
    if not len(working):
        return {}
    sms, counts = torch.unique(working[:, SM_COLUMN], return_counts=True)
    per_sm = dict(zip(sms.tolist(), counts.tolist()))
    loops = (working[:, computed] - working[:, waited]).tolist()
    crowd = [per_sm[sm] for sm in working[:, SM_COLUMN].tolist()]
    result: dict[str, Any] = {"sms": len(per_sm), "most_on_one_sm": max(per_sm.values())}
    for name, alone in (("computed_alone", True), ("computed_shared", False)):
        times = [loop for loop, n in zip(loops, crowd) if (n == 1) == alone]
        if times:
            result[name] = round(statistics.median(times) * unit, 3)
    return result


def _idle(rows: torch.Tensor, unit: float) -> dict[str, Any]:
    """A product launch's programs that computed nothing (a block of padding rows: a step's
    16-row programs leave three of four idle): how many, and how long after the last
    working program the last of them ended (`idle_end_after_work`, positive where they,
    not the work, ended the launch). Launches without a `computed` mark (attention's
    wave) have none."""
    computed, ended = PHASES.index("computed"), PHASES.index("ended")
    working = rows[:, computed] > 0
    if not bool(working.any()) or bool(working.all()):
        return {}
    return {"idle_programs": int((~working).sum()),
            "idle_end_after_work": round(float(rows[~working, ended].max() - rows[working, ended].max()) * unit, 3)}


def _durations(marks: list[int]) -> dict[str, float]:
    """A program's time in each phase it reached: from the mark before it."""
    durations, before = {}, marks[0]
    for phase, mark in zip(PHASES[1:], marks[1:]):
        if mark > 0:
            durations[phase] = float(mark - before)
            before = mark
    return durations


PROGRAM_FIELDS = ("sms", "most_on_one_sm", "computed_alone", "computed_shared",  # _per_sm's
             "idle_programs", "idle_end_after_work")  # _idle's


def summary(line: dict[str, Any]) -> dict[str, Any]:
    """The launches of each kind (a label's part before the dot), medians over them: its
    share of the pass, its lead and release, and its last program's phases; and each
    kind's shares added up."""
    kinds: dict[str, list[dict[str, Any]]] = {}
    for launch in line["launches"]:
        if launch.get("programs"):
            kinds.setdefault(launch["label"].split(".")[0], []).append(launch)
    result: dict[str, Any] = {"total": line["total"]}
    for kind, launches in kinds.items():
        phases = {phase: round(statistics.median(l["last_program"].get(phase, 0.0) for l in launches), 3)
                  for phase in PHASES[1:] if any(phase in l["last_program"] for l in launches)}
        result[kind] = {"launches": len(launches), "programs": launches[0]["programs"],
                        "share_sum": round(sum(l["share"] for l in launches), 3),
                        "share": round(statistics.median(l["share"] for l in launches), 3),
                        "lead": round(statistics.median(l["lead"] for l in launches), 3),
                        "release": round(statistics.median(l["release"] for l in launches), 3),
                        "last_program": phases,
                        **{name: round(statistics.median(l[name] for l in launches if name in l), 3)
                           for name in PROGRAM_FIELDS if any(name in l for l in launches)}}
    return result
