"""The `pdl` stage of scripts/gpu_check.py: what must change when and where work runs on
the GPU, never what it computes, checked bit for bit before any stage times or takes it.

* programmatic dependent launch (CODESPEC_CUDA_PDL) against none, for the default layers
  and the fused ones;
* a split summed by its last program (CODESPEC_CUDA_REDUCE=fold): steady, and within
  FOLD_TOLERANCE of the reduce kernel's own summation order;
* every SAME_BITS setting on the five-launch layers, and where one parts from them, the
  first layer whose keys or values differ (where_bits_part).

Where one fails, its flag (gpu_step: NO_PDL, NO_FOLD, SAME_BITS' own) is set for the rest
of the run, so no later stage, process or variant takes it. Split from scripts/gpu_step.py
(2026-12-03), whose settings and variants it checks."""

from __future__ import annotations

import os
from typing import Any

import torch

from gpu_measure import _engine, random_tree
from gpu_step import (DEFAULTS, FIVE_LAUNCHES, M16, NO_FOLD, NO_FUSED, NO_PDL, SAME_BITS, fails_to_run,
                      restore_environment, variant_env)

# A fold's logits against the reduce kernel's, relative: its own summation order moves a
# few bf16 roundings (~1e-3); a split lost to a race moves a product by ~1/SPLITS.
FOLD_TOLERANCE = 0.05


@torch.inference_mode()
def pdl_check(loaded: Any, context: int = 700, repeat: int = 3) -> dict[str, Any]:
    """Programmatic dependent launch (CODESPEC_CUDA_PDL) and a split summed by its last
    program (CODESPEC_CUDA_REDUCE=fold), both the 2026-11-27 and never run on a GPU before,
    change when and where work runs, never what it computes: a prompt prefilled and a
    64-node tree pass's logits, with them (`repeat` times) against without, bit for bit,
    for the default layers (PDL) and the fused ones of 16-row programs (PDL warming the
    weights); folded, the same bits each time and within FOLD_TOLERANCE of the reduce
    kernel's (its own summation order). Then what moves reads or shares tiles, never
    arithmetic (SAME_BITS): the five-launch layers with each against without, bit for bit.
    Where PDL's differ or fail, NO_PDL is set; where the fold's do, NO_FOLD; where one of
    SAME_BITS' does, its flag: the step stage skips those variants and no later stage
    takes them (the fused
    64-row variant, unchecked here, is checked as any winner: its rows against its decode
    steps, then edit, verify and stress)."""
    from codespec.forward.cuda import CudaForward

    generator = torch.Generator().manual_seed(4)
    vocab = loaded.forward.config.vocab_size
    prompt = torch.randint(0, vocab, (context,), generator=generator).tolist()
    tree = random_tree(generator, vocab)

    gave_up = [0]  # the last passes' counted waits given up (0 without counted launches)

    def passes(env: dict[str, str], times: int, kv: list | None = None) -> list[torch.Tensor]:
        """The tree pass's logits `times` times after the prompt's prefill; into `kv`
        (where given) every layer's keys and values after the prefill, then after the passes."""
        os.environ.update(env)
        forward = CudaForward(loaded.model)
        cache = _engine(loaded, slots=1).cache  # the graph lives with it: both go when this returns
        cache.acquire(prompt)
        forward.prefill(cache, 0, prompt, 0)
        if kv is not None:
            kv.append(_kv_of(cache))
        logits = [forward.logits(cache, [(0, context, tree)]) for _ in range(times)]
        if kv is not None:
            kv.append(_kv_of(cache))
        gave_up[0] = forward.flags.errors() if forward.flags is not None else 0
        if forward.flags is not None:  # a launch that gave up waiting for its count (kernels/flags.py)
            result["flags_gave_up"] = result.get("flags_gave_up", 0) + gave_up[0]
        return logits

    off, pdl, fold = {"CODESPEC_CUDA_PDL": "off"}, {"CODESPEC_CUDA_PDL": "prefetch"}, {"CODESPEC_CUDA_REDUCE": "fold"}
    checks = {"default": (off, {"pdl": {"CODESPEC_CUDA_PDL": "launch"}}),
              "fused m16": ({**M16, **off}, {"pdl": pdl, "pdl fold": {**pdl, **fold}})}
    fused = not os.environ.get(NO_FUSED)  # the smoke stage found the fused layers running
    if not fused:
        checks = {"default": checks["default"]}
    saved = {name: os.environ.get(name) for name in DEFAULTS}
    result: dict[str, Any] = {} if fused else {"fused": "skipped: the fused layers failed their smoke"}
    try:
        for label, (own, candidates) in checks.items():
            reference = passes(variant_env(own), 1)[0]
            for name, extra in candidates.items():
                runs = passes(variant_env({**own, **extra}), repeat)
                same = all(torch.equal(logits, reference) for logits in runs)
                if "fold" not in name:
                    result[f"{label} {name}"] = same
                    continue
                # The fold sums a block's squares in the product's tile, the reduce kernel
                # in its own one-row tile: on a GPU their layouts reduce in other orders, so
                # its bits may differ and be right (the 2026-11-27 H100 run: they did). What
                # would show a race: passes that differ from each other, or far from these.
                steady = all(torch.equal(logits, runs[0]) for logits in runs[1:])
                relative = float((runs[0].float() - reference.float()).norm() / reference.float().norm())
                result[f"{label} {name}"] = steady and relative < FOLD_TOLERANCE
                result[f"{label} {name} detail"] = {"same_bits_as_launch": same, "steady": steady,
                                                    "relative_error": relative}
        five_kv: list = []
        reference = passes(variant_env(FIVE_LAUNCHES), 1, five_kv)[0] if fused else None
        for name, (extra, _) in SAME_BITS.items() if fused else ():
            if fails_to_run(variant_env({**FIVE_LAUNCHES, **extra})):  # the smoke found its kernels failing
                result[f"five-launch {name}"] = "skipped: the smoke stage found its kernels failing"
                continue
            kv: list = []
            runs = passes(variant_env({**FIVE_LAUNCHES, **extra}), repeat, kv)
            result[f"five-launch {name}"] = all(torch.equal(logits, reference) for logits in runs) and not gave_up[0]
            if not result[f"five-launch {name}"]:
                result[f"five-launch {name} detail"] = where_bits_part(reference, runs, five_kv, kv)
    except Exception as error:  # a launch the device or this triton refuses: both off for the run
        result["error"] = f"{type(error).__name__}: {str(error)[:300]}"
    finally:
        restore_environment(saved)
        torch.cuda.empty_cache()
    result["pdl_exact"] = all(result.get(name) is True for name in ("default pdl", "fused m16 pdl")[:1 + fused])
    result["fold_exact"] = result.get("fused m16 pdl fold") is True
    result["same_bits"] = {name: result.get(f"five-launch {name}") is True for name in SAME_BITS}
    for flag, exact in ((NO_PDL, result["pdl_exact"]), (NO_FOLD, result["fold_exact"]),
                        *((flag, result["same_bits"][name]) for name, (_, flag) in SAME_BITS.items())):
        if not exact:
            os.environ[flag] = "1"
    if not result["pdl_exact"]:
        os.environ["CODESPEC_CUDA_PDL"] = "off"  # the default's `auto` too, for the whole run
    return result


def _kv_of(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every layer's keys and values, copied (what the next pass may overwrite)."""
    return [(keys.clone(), values.clone()) for keys, values in zip(cache.keys, cache.values)]


def _first_layer_apart(ours: list[tuple[torch.Tensor, torch.Tensor]],
                       theirs: list[tuple[torch.Tensor, torch.Tensor]]) -> str | None:
    """The first layer whose keys or values differ in a bit ("3 keys"), None where none does."""
    for index, ((k, v), (their_k, their_v)) in enumerate(zip(ours, theirs)):
        for what, mine, other in (("keys", k, their_k), ("values", v, their_v)):
            if not torch.equal(mine, other):
                return f"{index} {what}"
    return None


def where_bits_part(reference: torch.Tensor, runs: list[torch.Tensor], reference_kv: list, kv: list) -> dict[str, Any]:
    """Where a SAME_BITS setting's passes part from the five-launch layers' (2026-11-28:
    `early` did on an H200, and the bits alone could not say where; 2026-11-28: from layer
    20's keys on, the same every pass: arithmetic, not a race): whether its passes
    agree with each other (a race would not), how far and in how many of the tree's rows
    the first differs, and the first layer whose keys or values differ after the prefill
    and after the passes (q/k/v's epilogue stores them: layer L's differ when anything
    before q/k/v of L did)."""
    first = runs[0]
    rows = (first != reference).any(dim=-1) if first.shape == reference.shape else None
    return {"steady": all(torch.equal(logits, first) for logits in runs[1:]),
            "relative_error": float((first.float() - reference.float()).norm() / reference.float().norm()),
            "rows_differing": None if rows is None else int(rows.sum()),
            "prefill_first_layer_apart": _first_layer_apart(kv[0], reference_kv[0]),
            "passes_first_layer_apart": _first_layer_apart(kv[1], reference_kv[1])}
