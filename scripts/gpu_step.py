"""The step stage of scripts/gpu_check.py and its checks, for the one bar the GPU runs
missed (plain decoding 3.6-4.6x the weights' read time; bar 3x):

* `step`: the backend's step and 32-row pass with each variant (VARIANTS: without
  programmatic dependent launch, the fused layers in 16- or 64-row programs, the grid
  attention schedule, cuBLASLt; each family's best together; other tiles of down,
  lm_head and the five-launch gate/up and down, and every candidate together, reported
  only), side by side, and the winner's rows against its decode steps;
* `plain`: plain decoding through the engine, the bar as a user meets it.

Here too: the settings the other stages share (DEFAULTS, VARIANTS, the flags a failed
check sets for the whole run, SAME_BITS). The `pdl` stage, which sets those flags, lives
in scripts/gpu_bits.py; the attention and l2 probes in scripts/gpu_probes.py (2026-11-28)."""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any, Iterator, Mapping

import torch

from codespec.kernels.row_linear import Config
from gpu_measure import (_engine, _wall_ms, device_ms, pass_replay, profile_step, row_checks,
                         step_floor)

# The settings every variant sets (the defaults), and each variant's own over them: the
# default first and last, to see the machine drift between them. 2026-11-27 made
# programmatic dependent launch the default on Hopper (`auto`); `no pdl` times without
# it, and the fused layers with it, their programs of 64 or 16 rows (a step computes one
# block), their products warming their own weights. 2026-11-27 removed the variants that
# lost on the H100: L2 warming on a side stream, the real rows' argmax, `single` attention.
DEFAULTS = {"CODESPEC_CUDA_ATTENTION": "worklist", "CODESPEC_CUDA_FUSED": "0", "CODESPEC_CUDA_PDL": "auto",
            "CODESPEC_CUDA_TILE_ROWS": "64", "CODESPEC_CUDA_REDUCE": "launch",
            "CODESPEC_CUDA_ROW_GROUP": "1", "CODESPEC_CUDA_PASS_ROW_GROUP": "0", "CODESPEC_CUDA_KEY_BLOCK": "128",
            "CODESPEC_CUDA_EARLY_KEYS": "0", "CODESPEC_CUDA_EARLY_ROWS": "0", "CODESPEC_CUDA_NARROW_STEPS": "0",
            "CODESPEC_CUDA_LM_SCREEN": "0", "CODESPEC_CUDA_ATTENTION_ROWS": "1",
            "TORCH_BLAS_PREFER_CUBLASLT": "0"}  # torch reads it at start-up: a later stage's process
FUSED, M16 = {"CODESPEC_CUDA_FUSED": "1"}, {"CODESPEC_CUDA_FUSED": "1", "CODESPEC_CUDA_TILE_ROWS": "16"}
# the 2026-11-27 fastest step: five launches a layer (both folds), 16-row programs, PDL warming
FIVE_LAUNCHES = {**M16, "CODESPEC_CUDA_PDL": "prefetch", "CODESPEC_CUDA_REDUCE": "fold",
                 "CODESPEC_CUDA_ATTENTION": "fold"}
PASS_BAR = 1.3  # the bar: a 32-row verify pass at most this many steps; a winner must keep it
# Gate/up's tile for the five-launch step (reported only: tiles have no setting). Its 76
# programs of 128 outputs leave 56 of the H200's 132 SMs without one. The 2026-11-28 trace
# fits one rate for every product: an SM's programs read ~28-30 GB/s between them (gate/up's
# median program, 229 KB in 7.6 us; lm_head, whose 1,187 programs keep every SM busy, 3.1
# TB/s over 132 SMs; o's and down's with ~1.5 us of latency added). By that, a product takes
# its busiest SM's bytes over that rate: 152 programs (64 outputs, or a two-way split) put
# two on 20 SMs, the bytes of one of 76 (no gain), where 608 of 16 outputs put at most 5
# of 28 KB on any (143 KB against 229: ~3 us a layer less) and 304 of 32 at most 3 of 57
# KB (172 KB). Two warps: at four, a 128-wide K step is one norm weight a thread, too narrow
# to copy asynchronously, and the K loop waits on a plain load each step (the 2026-11-28 sm_90
# build; tests/kernels/test_sm90_compile.py).
FIVE_GATE_UP_TILES = {"five-launch, gate_up 16 outputs": Config(16, 16, 128, num_warps=2, num_stages=4),
                      "five-launch, gate_up 32 outputs": Config(16, 32, 128, num_warps=2, num_stages=4),
                      "five-launch, gate_up 64 outputs": Config(16, 64, 128, num_warps=8, num_stages=3),
                      "five-launch, gate_up split 2": Config(16, 128, 128, splits=2, num_warps=8, num_stages=3)}
# Down's for it (2026-11-28, reported only): by the same rate, its 224 programs of 41 KB put
# two on 92 SMs (82 KB); 1,064 of 16 outputs and a 19-way split of K (8 KB each, folded)
# put at most 9 on any (72 KB): what the rate model says of a second product.
FIVE_DOWN_TILES = {"five-launch, down 16 outputs, split 19": Config(16, 16, 64, splits=19, num_warps=2,
                                                                   num_stages=4)}
# lm_head behind its int8 screen (2026-11-28, kernels/lm_screen.py): the 2026-11-28 probe timed
# the screen at 51 against the bf16 product's 75 us (16 rows), and the real weights' rows
# flag ~2 of 1,187 blocks; ~20 us a step if the four launches cost what the probe says.
LM_SCREEN = {"CODESPEC_CUDA_LM_SCREEN": "1"}
# Attention's rows in pairs sharing their context's key blocks (2026-11-28,
# kernels/row_attention.py): for the pass bar, where the 2026-11-28 32-row pass spent 14.4
# us a layer in attention against a step's 8.9 (320 items, two rounds of the wave); in
# pairs, 192 items, one round. Pairs, not fours: the fold with groups of four took 8
# bytes of stack under Triton 3.6 (pairs none). Not with early keys, so not among
# EVERY_CANDIDATE.
ATTENTION_ROWS = {"CODESPEC_CUDA_ATTENTION_ROWS": "2"}
# The plain bar's candidates together (2026-11-28): the five-launch layers with attention
# over 64-key blocks, begun before its wait, the products' live rows read before theirs,
# gate/up over every SM, and (2026-11-28) lm_head's screen (the step stage, the plain_five
# stage's `plain_five_all`, the trace).
EVERY_CANDIDATE = {**FIVE_LAUNCHES, "CODESPEC_CUDA_KEY_BLOCK": "64", "CODESPEC_CUDA_EARLY_KEYS": "1",
                   "CODESPEC_CUDA_EARLY_ROWS": "1", **LM_SCREEN}
EVERY_TILES = {"gate_up": FIVE_GATE_UP_TILES["five-launch, gate_up 16 outputs"]}
EVERY_LABEL = "five-launch, 64-key blocks, early keys and rows, gate_up 16 outputs, lm screen"
# ... and steps in a graph of the bucket's first rows (the smoke's candidates, a plain run, a trace)
EVERY_NARROW = {**EVERY_CANDIDATE, "CODESPEC_CUDA_NARROW_STEPS": "1"}


def variant_env(own: dict[str, str], run: Mapping[str, str | None] | None = None) -> dict[str, str]:
    """A variant's whole settings: DEFAULTS with attention's schedule and PDL as the run
    settled them (the grid where the worklist failed the kernel stage's check, PDL off
    where the pdl stage found it changing a bit: gpu_check sets them for the whole run),
    then the variant's own. `run`: the run's settings as a stage found them (default: the
    environment now). A stage that measures variants one after another passes what it
    saved at its start: each variant's settings go into the environment, and until
    2026-11-27 the step stage read the next variant's from there (every variant after
    `fused m16 pdl/prefetch fold, fold attention` ran with attention folded, and after
    `grid attention`, the grid; `default (again)` too)."""
    run = os.environ if run is None else run
    settled = {name: run.get(name) or DEFAULTS[name] for name in SETTLED}
    return {**DEFAULTS, **settled, **own}


# In order of what a deadline should keep: the variants whose kernels gpu_bits.pdl_check compiled
# first (Triton compiles each kernel once a process: ~2 s each on the H100 machine).
VARIANTS: dict[str, dict[str, str]] = {
    "default": {}, "no pdl": {"CODESPEC_CUDA_PDL": "off"},
    "fused m16 pdl/prefetch": {**M16, "CODESPEC_CUDA_PDL": "prefetch"},
    "fused m16 pdl/prefetch fold": {**M16, "CODESPEC_CUDA_PDL": "prefetch", "CODESPEC_CUDA_REDUCE": "fold"},
    # five launches a layer (2026-11-27): the fused layers folded, attention's combine folded
    "fused m16 pdl/prefetch fold, fold attention": FIVE_LAUNCHES,
    # ... attention over 64-key blocks (2026-11-28): alone, 6.6 against 8.3 us a layer at 512
    # keys on every run since 2026-11-27; twice the items, the fold's combine 16 partials a step
    "fused m16 pdl/prefetch fold, fold attention, 64-key blocks": {**FIVE_LAUNCHES, "CODESPEC_CUDA_KEY_BLOCK": "64"},
    # ... attention's first item begun before its wait (2026-11-28: three of the ~6 round trips
    # after it, where the fold's last program took 8.2 us a layer in the 2026-11-28 trace)
    "fused m16 pdl/prefetch fold, fold attention, early keys": {**FIVE_LAUNCHES, "CODESPEC_CUDA_EARLY_KEYS": "1"},
    "fused m16 pdl/prefetch fold, fold attention, 64-key blocks, early keys": {
        **FIVE_LAUNCHES, "CODESPEC_CUDA_KEY_BLOCK": "64", "CODESPEC_CUDA_EARLY_KEYS": "1"},
    # ... each product's live rows read before its wait (2026-11-28: one round trip off each)
    "fused m16 pdl/prefetch fold, fold attention, early rows": {**FIVE_LAUNCHES, "CODESPEC_CUDA_EARLY_ROWS": "1"},
    # ... lm_head behind its int8 screen (2026-11-28)
    "fused m16 pdl/prefetch fold, fold attention, lm screen": {**FIVE_LAUNCHES, **LM_SCREEN},
    # ... attention's rows in pairs sharing their context's blocks (2026-11-28: the pass bar)
    "fused m16 pdl/prefetch fold, fold attention, attention rows 2": {**FIVE_LAUNCHES, **ATTENTION_ROWS},
    # ... steps in a graph of the bucket's first 16 rows alone (2026-11-28: no blocks of
    # padding rows; its rows are checked against the full bucket's where it wins)
    "fused m16 pdl/prefetch fold, fold attention, narrow steps": {**FIVE_LAUNCHES, "CODESPEC_CUDA_NARROW_STEPS": "1"},
    # ... and passes wider than a block in a graph of their own, rows grouped four blocks a
    # weight tile (2026-11-28): a step's graph a group of one's, a 32-row pass's weights once
    "fused m16 pdl/prefetch fold, fold attention, pass row group": {**FIVE_LAUNCHES,
                                                                    "CODESPEC_CUDA_PASS_ROW_GROUP": "4"},
    "fused m16 pdl/prefetch fold, fold attention, 64-key blocks, pass row group": {
        **FIVE_LAUNCHES, "CODESPEC_CUDA_KEY_BLOCK": "64", "CODESPEC_CUDA_PASS_ROW_GROUP": "4"},
    # ... computing a bucket's four blocks of rows in one program a weight tile (2026-11-27)
    "fused m16 pdl/prefetch fold, fold attention, row group": {**FIVE_LAUNCHES, "CODESPEC_CUDA_ROW_GROUP": "4"},
    # ... each launch waiting on the count of the stores before it, not on that launch's end
    "fused m16 pdl/flags fold, fold attention": {**FIVE_LAUNCHES, "CODESPEC_CUDA_PDL": "flags"},
    # 32-row programs: a 32-row pass is one block of rows (16-row programs read every
    # weight twice for it: the 2026-11-27 16-row fused pass cost 1.56 steps)
    "fused m32 pdl/prefetch fold": {**FUSED, "CODESPEC_CUDA_TILE_ROWS": "32", "CODESPEC_CUDA_PDL": "prefetch",
                                    "CODESPEC_CUDA_REDUCE": "fold"},
    "fused m32 pdl/prefetch fold, fold attention": {**FUSED, "CODESPEC_CUDA_TILE_ROWS": "32",
                                                    "CODESPEC_CUDA_PDL": "prefetch", "CODESPEC_CUDA_REDUCE": "fold",
                                                    "CODESPEC_CUDA_ATTENTION": "fold"},
    "fused m16": M16, "fold attention": {"CODESPEC_CUDA_ATTENTION": "fold"},
    "64-key blocks": {"CODESPEC_CUDA_KEY_BLOCK": "64"},
    "early keys": {"CODESPEC_CUDA_EARLY_KEYS": "1"},
    "grid attention": {"CODESPEC_CUDA_ATTENTION": "grid"},
    "fused pdl/prefetch": {**FUSED, "CODESPEC_CUDA_PDL": "prefetch"}, "fused": FUSED,
    "cublaslt": {"TORCH_BLAS_PREFER_CUBLASLT": "1"}, "default (again)": {}}
SETTLED = ("CODESPEC_CUDA_ATTENTION", "CODESPEC_CUDA_PDL")  # what a failed check turns off for the whole run
NO_PDL = "CODESPEC_GPU_CHECK_NO_PDL"  # set by gpu_bits.pdl_check where PDL changed a bit: no stage takes it
NO_FOLD = "CODESPEC_GPU_CHECK_NO_FOLD"  # ... where a folded split did
# set by the smoke stage (gpu_smoke.py) where the fused layers failed to run: nothing in
# this process may launch them (a device fault would end every stage after it)
NO_FUSED = "CODESPEC_GPU_CHECK_NO_FUSED"
# ... and where the plain bar's candidates failed to (2026-11-28: attention's early keys,
# gate/up's 16-output tile; EVERY_CANDIDATE)
NO_CANDIDATES = "CODESPEC_GPU_CHECK_NO_CANDIDATES"
# ... and where lm_head's screen failed to, the other candidates running (2026-11-28: its
# four launches are tried last in the candidates' process)
NO_SCREEN = "CODESPEC_GPU_CHECK_NO_SCREEN"
# ... and where attention's rows in groups failed to
NO_ATTENTION_ROWS = "CODESPEC_GPU_CHECK_NO_ATTENTION_ROWS"
# The smoke's candidates tried apart, after the others in their process: (the part's
# entry, its settings, the fused tiles, the flag that keeps it off where it fails)
TRIED_APART = (("screen", EVERY_NARROW, EVERY_TILES, NO_SCREEN),
               ("attention_rows", {**FIVE_LAUNCHES, **ATTENTION_ROWS}, None, NO_ATTENTION_ROWS))
# Settings that move reads or share a weight tile among blocks of rows, never a row's
# arithmetic (2026-11-27): the pdl stage asks the five-launch layers for the same bits with
# each as without; where one differs, its flag is set and no stage takes it. (The 2026-11-27
# `early` was one until 2026-11-28 found what changed its bits on the H200: another
# layout of the epilogue's sums, not a read; removed.)
SAME_BITS = {"row group": ({"CODESPEC_CUDA_ROW_GROUP": "4"}, "CODESPEC_GPU_CHECK_NO_GROUP"),
             "flags": ({"CODESPEC_CUDA_PDL": "flags"}, "CODESPEC_GPU_CHECK_NO_FLAGS"),
             # 2026-11-28: the tree pass (64 rows) in the wide passes' graph, rows grouped
             "pass row group": ({"CODESPEC_CUDA_PASS_ROW_GROUP": "4"}, "CODESPEC_GPU_CHECK_NO_PASS_GROUP"),
             # 2026-11-28: attention's first item begun before the wait (the same loads, split)
             "early keys": ({"CODESPEC_CUDA_EARLY_KEYS": "1"}, "CODESPEC_GPU_CHECK_NO_EARLY_KEYS"),
             # ... and the products' live rows read before their wait
             "early rows": ({"CODESPEC_CUDA_EARLY_ROWS": "1"}, "CODESPEC_GPU_CHECK_NO_EARLY_ROWS"),
             # 2026-11-28: attention's rows in groups (the same partials, their keys loaded once)
             "attention rows": (ATTENTION_ROWS, "CODESPEC_GPU_CHECK_NO_ATTENTION_GROUPS")}
# Every flag the smoke and pdl stages may set for the rest of the run
CHECK_FLAGS = (NO_PDL, NO_FOLD, NO_FUSED, NO_CANDIDATES, NO_SCREEN, NO_ATTENTION_ROWS,
               *(flag for _, flag in SAME_BITS.values()))
FAMILIES = {"layers": lambda label: label == "no pdl" or label.startswith("fused"),
            "attention": lambda label: label.endswith("attention") and not label.startswith("fused"),
            "key block": lambda label: label == "64-key blocks",
            "early keys": lambda label: label == "early keys",
            "blas": lambda label: label == "cublaslt"}


def step_probe(loaded: Any, deadline_s: float = 100.0, context: int = 512) -> dict[str, Any]:
    """The backend's step (one row) and a 32-row pass at `context` keys (host wall ms,
    medians of 30) with each variant (VARIANTS), and the step's and the pass's graphs
    replayed 20 times back to back with their own metadata (device ms, no host between).
    Then each family's best
    (FAMILIES) together, where two or more beat the default alone; the 2026-11-26
    fastest tiles for down and lm_head (`down tiles`, `lm_head tile`: row_linear, the
    latter with the greedy choices from its epilogue, no argmax pass; reported only:
    tiles have no setting); the fastest variant's rows against its decode steps (a cache hint cannot
    change a value: this checks PDL's ordering and the fused products) and its step's
    profile; and the fastest fused variant's profile where it did not win. The winner
    (`best`) is the fastest step among the variants whose 32-row pass stays within
    PASS_BAR steps (`fastest_step` names the fastest of all), both by the graphs' device
    times since 2026-11-28 (the host's wall time of one graph moved by 13% between two
    variants that built it; the engine queues plain steps one ahead, so the host's part
    is hidden there)."""
    from codespec.forward.cuda import CudaForward

    default, floor = loaded.forward, step_floor(loaded)
    result: dict[str, Any] = {"floor_ms": floor["floor_ms"], "context": context, "variants": {}}
    began = time.perf_counter()
    saved = {name: os.environ.get(name) for name in DEFAULTS}  # the run's own settings
    envs: dict[str, dict[str, str]] = {}
    try:
        for key, own in VARIANTS.items():
            if time.perf_counter() - began > deadline_s:
                result["cut_short"] = True
                break
            if unchecked(own):
                result["variants"][key] = {"skipped": "the pdl stage found its bits not those without it"}
                continue
            envs[key] = variant_env(own, saved)
            result["variants"][key] = _measure(loaded, envs[key], floor["floor_ms"], context)
        timed = {k: step_time(v) for k, v in result["variants"].items() if "step_ms" in v}
        base = min((v for k, v in timed.items() if k.startswith("default")), default=None)
        if base is None:
            return result
        # a winner keeps the pass bar: a faster step that makes verify passes dear is no win
        keeps = {k for k, v in result["variants"].items() if pass_ratio(v) <= PASS_BAR}
        # each family's best where it beat the default by 0.5%, together
        winners = [min(family, key=timed.get) for family in
                   ([k for k in timed if of(k) and k in keeps and timed[k] < 0.995 * base]
                    for of in FAMILIES.values()) if family]
        if len(winners) > 1 and time.perf_counter() - began < deadline_s:
            envs["combined"] = dict(envs["default"])
            for winner in winners:  # each family's own settings over the default's
                envs["combined"].update({k: v for k, v in envs[winner].items() if v != envs["default"][k]})
            result["variants"]["combined"] = _measure(loaded, envs["combined"], floor["floor_ms"], context)
            combined = result["variants"]["combined"]
            timed["combined"] = step_time(combined)
            if pass_ratio(combined) <= PASS_BAR:
                keeps.add("combined")
        if time.perf_counter() - began < deadline_s:
            result["down tiles"] = _measure(loaded, envs["default"], floor["floor_ms"], context,
                                            tiles={"down": Config(64, 32, 64, splits=4)})
        if time.perf_counter() - began < deadline_s:  # the 2026-11-26 fastest lm_head tile, its choices in the epilogue
            result["lm_head tile"] = _measure(loaded, envs["default"], floor["floor_ms"], context,
                                              tiles={"lm_head": Config(64, 64, 64)})
        if time.perf_counter() - began < deadline_s:  # cuBLAS's split-K reduced in fp32: its choice of kernels
            result["fp32 reductions"] = _measure(loaded, envs["default"], floor["floor_ms"], context, reduction=False)
        five = variant_env(FIVE_LAUNCHES, saved)
        other_tiles = [*(("gate_up", label, tile) for label, tile in FIVE_GATE_UP_TILES.items()),
                       *(("down", label, tile) for label, tile in FIVE_DOWN_TILES.items())]
        for product, label, tile in other_tiles:  # the five-launch step with another tile of one product
            if time.perf_counter() - began < deadline_s and not unchecked(five) and not fails_to_run(five, tile):
                result[label] = _measure(loaded, five, floor["floor_ms"], context, tiles={product: tile})
        every = variant_env(EVERY_CANDIDATE, saved)  # 2026-11-28: every candidate together
        if time.perf_counter() - began < deadline_s and not unchecked(every) and not fails_to_run(every, EVERY_TILES):
            result[EVERY_LABEL] = _measure(loaded, every, floor["floor_ms"], context, tiles=EVERY_TILES)
        best = min((k for k in timed if k in keeps), key=timed.get, default=min(timed, key=timed.get))
        result.update(best=best, best_over_default=round(timed[best] / base, 3), best_env=envs[best],
                      fastest_step=min(timed, key=timed.get))
        if not best.startswith("default"):
            os.environ.update(envs[best])
            loaded.forward = CudaForward(loaded.model)
            result["best_rows"] = row_checks(loaded)
            if time.perf_counter() - began < deadline_s + 15:  # where the winner's step goes, beside `profile`
                result["best_profile"] = profile_step(loaded)
        fused = min((k for k in timed if k.startswith("fused")), key=timed.get, default=None)
        if fused is not None and fused != best and time.perf_counter() - began < deadline_s + 15:
            # where the fastest fused layers' step goes (each kernel's time), to tune them
            # next, when they did not win
            os.environ.update(envs[fused])
            loaded.forward = CudaForward(loaded.model)
            result["fused_profile"] = {"variant": fused, **profile_step(loaded)}
    finally:
        loaded.forward = default
        restore_environment(saved)
    return result


def fails_to_run(env: Mapping[str, str], tiles: Mapping[str, Any] | None = None) -> bool:
    """Whether `env` (with the fused products' `tiles`, where given) takes the fused layers
    where the smoke stage found them failing to run, a candidate where it found the
    candidates failing, or lm_head's screen where it found that failing (gpu_smoke.py):
    no stage of this process may launch them."""
    if env.get("CODESPEC_CUDA_FUSED") == "1" and bool(os.environ.get(NO_FUSED)):
        return True
    if env.get("CODESPEC_CUDA_LM_SCREEN") == "1" and bool(os.environ.get(NO_SCREEN)):
        return True
    if env.get("CODESPEC_CUDA_ATTENTION_ROWS", "1") != "1" and bool(os.environ.get(NO_ATTENTION_ROWS)):
        return True
    new = any(env.get(f"CODESPEC_CUDA_{name}") == "1"
              for name in ("EARLY_KEYS", "EARLY_ROWS", "NARROW_STEPS", "LM_SCREEN")) or \
        env.get("CODESPEC_CUDA_ATTENTION_ROWS", "1") != "1"
    return bool(os.environ.get(NO_CANDIDATES)) and (new or bool(tiles))


def unchecked(env: dict[str, str]) -> bool:
    """Whether `env` takes PDL, the fold or a SAME_BITS setting where the pdl stage found
    it changing a bit, or the fused layers where they failed their smoke (gpu_smoke.py).
    (The 2026-11-28 exception, a setting taken where a combination holding it kept the
    bits, went with `early`, its one case.)"""
    if (env.get("CODESPEC_CUDA_PDL", "off") not in ("off", "auto") and bool(os.environ.get(NO_PDL))) or \
            (env.get("CODESPEC_CUDA_REDUCE", "launch") == "fold" and bool(os.environ.get(NO_FOLD))) or \
            fails_to_run(env):
        return True
    return any(bool(os.environ.get(flag)) and all(env.get(name) == value for name, value in extra.items())
               for extra, flag in SAME_BITS.values())


@contextlib.contextmanager
def blas_of(env: dict[str, str]) -> Iterator[None]:
    """cuBLASLt where `env` asks for it (torch reads TORCH_BLAS_PREFER_CUBLASLT only at
    start-up: a variant in this process chooses it by hand), the process's choice after."""
    blas = torch.backends.cuda.preferred_blas_library()
    try:
        if env.get("TORCH_BLAS_PREFER_CUBLASLT") == "1":
            torch.backends.cuda.preferred_blas_library("cublaslt")
        yield
    finally:
        torch.backends.cuda.preferred_blas_library(blas)


def restore_environment(saved: dict[str, str | None]) -> None:
    """The environment's settings back as `saved` had them (None: unset)."""
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def step_time(entry: dict[str, Any]) -> float:
    """A variant's step in ms: the graph's device time where measured (inf where it failed)."""
    return entry.get("device_step_ms", entry.get("step_ms", float("inf")))


def pass_ratio(entry: dict[str, Any]) -> float:
    """A variant's 32-row pass over its step: the graphs' device times where measured."""
    return entry.get("device_pass32_over_step", entry.get("pass32_over_step", PASS_BAR + 1))


def _measure(loaded: Any, env: dict[str, str], floor_ms: float, context: int,
             tiles: dict[str, Any] | None = None, reduction: bool | None = None) -> dict[str, Any]:
    """One variant: its backend built and its graph captured under `env` (and cuBLAS's
    bf16 reduced-precision reductions allowed or not, where `reduction` says), then timed."""
    from codespec.forward.cuda import CudaForward
    from codespec.policy.tree import VerifyTree

    os.environ.update(env)  # read as the backend is built and its graph captured
    prompt = [(7 * i) % loaded.forward.config.vocab_size for i in range(context)]
    forward = cache = None
    try:
        with blas_of(env):
            if reduction is not None:
                torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = reduction
            forward = CudaForward(loaded.model, tiles=tiles)
            cache = _engine(loaded, slots=1).cache  # held here: the bucket's graph lives with it
            cache.acquire(prompt)
            forward.prefill(cache, 0, prompt, 0)
            step, pass32 = VerifyTree.chain(11), VerifyTree.chain(11, [13] * 31)
            entry: dict[str, Any] = {"step_ms": _wall_ms(lambda: forward.choices(cache, [(0, context, step)])),
                                     "pass32_ms": _wall_ms(lambda: forward.choices(cache, [(0, context, pass32)]))}
            entry["step_over_floor"] = round(entry["step_ms"] / floor_ms, 2)
            entry["pass32_over_step"] = round(entry["pass32_ms"] / entry["step_ms"], 2)
            # the graphs alone, replayed back to back with their own pass's metadata: the
            # kernels' time without the host's (2026-11-28: one graph's host wall differed
            # by 13% between two variants that built it), what the winner is chosen by
            entry["device_step_ms"] = device_ms(pass_replay(forward, cache, context, step))
            entry["device_pass32_ms"] = device_ms(pass_replay(forward, cache, context, pass32))
            entry["device_pass32_over_step"] = round(entry["device_pass32_ms"] / entry["device_step_ms"], 2)
    except Exception as error:  # a mode the device cannot run: say so, go on
        entry = {"error": f"{type(error).__name__}: {str(error)[:300]}"}
    finally:
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = True  # torch's default
    forward = cache = None  # the graph and its cache go before the next variant
    torch.cuda.empty_cache()
    return entry


def winner_env(results: dict[str, Any]) -> dict[str, str] | None:
    """The step stage's winner's settings where it beat the default step by 3% and its
    rows held (the later stages run again with them); None otherwise."""
    probe = results.get("step", {})
    best, ratio, rows = probe.get("best", "default"), probe.get("best_over_default", 1.0), probe.get("best_rows", {})
    if best.startswith("default") or ratio > 0.97 or rows.get("rows_differing", 1) != 0:
        return None
    if unchecked(probe["best_env"]):
        return None
    return dict(probe["best_env"])


def plain_probe(loaded: Any, new_tokens: int = 256, context: int = 512, repeat: int = 3) -> dict[str, Any]:
    """Plain decoding through the engine at batch 1 (speculation off), ms per generated
    token after the first, with the cuda backend's steps queued one ahead
    (forward/chained.py) and without, interleaved `repeat` times; outputs compared. The
    bar's "plain decoding per step" as a user meets it: host work included."""
    import statistics

    from codespec.engine import Engine, GenerationConfig

    forward, floor = loaded.forward, step_floor(loaded)
    engine = Engine(forward, loaded.tokenizer, eos_token_ids=[], slots=2)
    prompt = [(11 * i) % forward.config.vocab_size for i in range(context)]
    config = GenerationConfig(max_new_tokens=new_tokens, speculate=False)
    saved = forward.chains_steps
    times: dict[str, list[float]] = {"chained": [], "unchained": []}
    outputs: dict[str, list[int]] = {}
    try:
        for _ in range(repeat):
            for label, chained in (("unchained", False), ("chained", True)):
                forward.chains_steps = chained
                out = engine.generate(prompt, config)
                times[label].append((out.stats.wall_s - out.stats.ttft_s) / (len(out.token_ids) - 1) * 1e3)
                outputs[label] = out.token_ids
    finally:
        forward.chains_steps = saved
    result: dict[str, Any] = {f"{label}_ms_per_token": round(statistics.median(values), 4)
                              for label, values in times.items()}
    result.update(identical=outputs["chained"] == outputs["unchained"], floor_ms=floor["floor_ms"],
                  chained_over_floor=round(result["chained_ms_per_token"] / floor["floor_ms"], 2),
                  unchained_over_floor=round(result["unchained_ms_per_token"] / floor["floor_ms"], 2),
                  chained_taken=forward.chained_taken, chained_dropped=forward.chained_dropped)
    return result
