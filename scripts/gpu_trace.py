"""The `trace` stage (2026-11-27): where a step's time goes inside the fused layers, launch
by launch and inside each launch's programs (kernels/trace.py).

Why. The 2026-11-27 H100 run left the plain step at 1.19 ms against a 1.0 ms bar, and
cutting launches (273 -> 125) did not move it; the products' per-launch times (qkv 6.7
us for 2 MB, o 4.5 for 1.6, down 10.1 for 8.7) say each is a chain of latencies, not
which. Here the fused backend's kernels write %globaltimer at each phase of each program
(start, past `pdl_wait`, products summed, a split's sum folded, last store), and one
replay of the step's CUDA graph gives, per launch: how long after the launch before it
ended its first program started (negative: early, as programmatic dependent launch
allows), its share of the step (its end minus the end before), and the phases of its
program that ended last. `summary` gives each kind's median over the 24 layers.

Each variant (TRACED) is built twice, traced and not, so the marks' own cost shows as
the traced graph's device time against the untraced one's. The 32-row pass is traced too
(the pass bar: where its extra time goes). Without a CUDA graph (the CPU tests, under
the interpreter's logical clock) a replay is the same pass run again."""

from __future__ import annotations

import os
import statistics
from typing import Any

import torch

from gpu_measure import _engine, device_ms, pass_replay
from gpu_step import (ATTENTION_ROWS, DEFAULTS, EVERY_CANDIDATE, EVERY_LABEL, EVERY_NARROW, EVERY_TILES,
                      FIVE_LAUNCHES, fails_to_run, restore_environment, variant_env)

# The fastest step of 2026-11-27 (five launches a layer); the same with attention over
# 64-key blocks (CODESPEC_CUDA_KEY_BLOCK=64, 2026-11-28: 6.6 against 8.3 us alone); with
# passes wider than a block in the row-grouped graph (CODESPEC_CUDA_PASS_ROW_GROUP=4:
# the 2026-11-28 step stage timed its 32-row pass slower, 1.51 against 1.39 ms: where?).
TRACED = {"fused m16 pdl/prefetch fold, fold attention": FIVE_LAUNCHES,
          "fused m16 pdl/prefetch fold, fold attention, 64-key blocks": {**FIVE_LAUNCHES,
                                                                         "CODESPEC_CUDA_KEY_BLOCK": "64"},
          "fused m16 pdl/prefetch fold, fold attention, pass row group": {**FIVE_LAUNCHES,
                                                                          "CODESPEC_CUDA_PASS_ROW_GROUP": "4"},
          # 2026-11-28: attention begun before its wait, and every candidate with gate/up over every SM
          "fused m16 pdl/prefetch fold, fold attention, early keys": {**FIVE_LAUNCHES,
                                                                      "CODESPEC_CUDA_EARLY_KEYS": "1"},
          EVERY_LABEL: EVERY_CANDIDATE,
          # ... and steps in a graph of the bucket's first 16 rows (no idle blocks of rows)
          EVERY_LABEL + ", narrow steps": EVERY_NARROW,
          # 2026-11-28: attention's rows in pairs (the pass bar: its 32-row pass)
          "fused m16 pdl/prefetch fold, fold attention, attention rows 2": {**FIVE_LAUNCHES, **ATTENTION_ROWS}}
TRACED_TILES = {EVERY_LABEL: EVERY_TILES,  # a variant's fused tiles (tiles have no setting)
                EVERY_LABEL + ", narrow steps": EVERY_TILES}
REPLAYS = 5  # traced replays of each pass; the median one (by its total) is reported


def trace_probe(loaded: Any, context: int = 512) -> dict[str, Any]:
    """Each TRACED variant's step and 32-row pass at `context` keys: the traced replays'
    median timeline (kind by kind, and each launch), and the graph's device ms traced
    and untraced."""
    result: dict[str, Any] = {"context": context}
    saved = {name: os.environ.get(name) for name in DEFAULTS}
    try:
        for name, own in TRACED.items():
            env = variant_env(own, saved)
            if fails_to_run(env, TRACED_TILES.get(name)):
                result[name] = {"skipped": "the smoke stage found its kernels failing (gpu_smoke.py)"}
                continue
            os.environ.update(env)
            result[name] = _traced(loaded, context, TRACED_TILES.get(name))
    finally:
        restore_environment(saved)
    return result


def _traced(loaded: Any, context: int, tiles: dict[str, Any] | None = None) -> dict[str, Any]:
    from codespec.forward.cuda import CudaForward
    from codespec.kernels.trace import summary
    from codespec.policy.tree import VerifyTree

    prompt = [(7 * i) % loaded.forward.config.vocab_size for i in range(context)]
    step, pass32 = VerifyTree.chain(11), VerifyTree.chain(11, [13] * 31)
    entry: dict[str, Any] = {}
    for traced in (False, True):
        forward = CudaForward(loaded.model, trace=traced, tiles=tiles)
        cache = _engine(loaded, slots=1).cache  # held here: the bucket's graph lives with it
        cache.acquire(prompt)
        forward.prefill(cache, 0, prompt, 0)
        for label, tree in (("step", step), ("pass32", pass32)):
            replay = pass_replay(forward, cache, context, tree)
            part = entry.setdefault(label, {})
            part["traced_device_ms" if traced else "device_ms"] = device_ms(replay)
            if traced:
                lines = []
                for _ in range(REPLAYS):
                    forward.tracer.clear()
                    replay()
                    torch.cuda.synchronize()
                    lines.append(forward.tracer.timeline(forward.layout(len(tree.tokens))))
                line = sorted(lines, key=lambda one: one["total"])[len(lines) // 2]
                part.update(totals_us=[one["total"] for one in lines], median_total_us=statistics.median(
                    one["total"] for one in lines), kinds=summary(line), launches=line["launches"])
                if forward.flags is not None:  # a launch that gave up waiting for its count
                    part["flags_gave_up"] = forward.flags.errors()
        forward = cache = None  # the graph and its cache go before the next build
        torch.cuda.empty_cache()
    return entry


def report(stage: dict[str, Any]) -> str:
    """The trace stage's result as markdown, a table per variant and pass: each kind's
    launches, median share of the pass, lead, release and last program's phases (us), and
    how its working programs shared the SMs and what its idle ones cost (kernels/trace.py's
    `_per_sm` and `_idle`)."""
    from codespec.kernels.trace import PHASES, PROGRAM_FIELDS

    # the programs' columns (2026-11-28): the SMs' where the run's marks name them, the idle ones'
    columns = ["launches", "share", "share_sum", "lead", "release", *PHASES[1:], *PROGRAM_FIELDS]
    out = []
    for variant, passes in stage.items():
        if not isinstance(passes, dict):
            continue
        for label, part in passes.items():
            if not isinstance(part, dict) or "kinds" not in part:
                continue
            kinds = part["kinds"]
            out.append(f"**{variant}, {label}**: {part['median_total_us']} us traced "
                       f"(graph {part.get('traced_device_ms')} ms traced, {part.get('device_ms')} ms untraced)\n")
            out.append("| kind | " + " | ".join(columns) + " |")
            out.append("|---" * (len(columns) + 1) + "|")
            for kind, entry in kinds.items():
                if kind == "total":
                    continue
                values = [entry.get(name, entry["last_program"].get(name, "")) for name in columns]
                out.append(f"| {kind} | " + " | ".join(str(value) for value in values) + " |")
            out.append("")
    return "\n".join(out)


if __name__ == "__main__":  # python scripts/gpu_trace.py docs/gpu/<run>.json: the trace stage as tables
    import json
    import sys
    from pathlib import Path

    print(report(json.loads(Path(sys.argv[1]).read_text())["trace"]))
