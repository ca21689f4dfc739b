"""The `smoke` stage of scripts/gpu_check.py (2026-11-28): the kernels no GPU has run yet,
each once, in a process of its own, before the check's own process launches them.

Why. A kernel that faults on the device (an illegal address, a misaligned access)
leaves the process's CUDA context unusable: every later launch fails, so one untried
kernel would cost every stage after it, the whole device call. Here each part runs in a
fresh process; the check reads which passed and turns off what failed for the rest of
the run (gpu_step.NO_FUSED). What compiles here stays in Triton's cache for the check's
process: the smoke costs the imports and a few launches.

Parts (`python scripts/gpu_smoke.py PART MODEL_DIR`, one JSON line out, exit 1 on a
failure):
* `fused`: the five-launch layers on the random model: a prompt prefilled, then a tree
  pass, its logits finite. (The 2026-11-28 `walk` part ran attention's walk schedule;
  2026-11-28 removed the schedule.)
* `candidates` (2026-11-28): the same with every candidate for the plain bar
  (gpu_step.EVERY_NARROW: attention over 64-key blocks begun before its wait, the
  products' live rows read before theirs, gate/up's 16-output tile at two warps) and
  narrow steps (CODESPEC_CUDA_NARROW_STEPS), a one-row step through their graph too;
  then, in the same process on the model already loaded, each of gpu_step.TRIED_APART
  (2026-11-28): all that with lm_head behind its int8 screen (its four launches and its
  logits' full product, `screen`), and the five-launch layers with attention's rows in
  groups (`attention_rows`). Where one of those alone fails, the check turns it off and
  keeps the others."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import torch

from gpu_step import EVERY_NARROW, EVERY_TILES, FIVE_LAUNCHES, LM_SCREEN, TRIED_APART

PARTS = ("fused", "candidates")


def fused_part(model_dir: str, env: dict[str, str], tiles: dict[str, Any] | None = None,
               loaded: Any = None) -> dict[str, Any]:
    """A prompt prefilled and a tree pass (then a step) through the backend `env` builds
    with the fused products' `tiles`, on the random model at `model_dir` (or `loaded`,
    already loaded): whether its logits are finite."""
    from codespec import forward
    from codespec.engine import Engine
    from codespec.settings import Settings

    from gpu_measure import random_tree

    from codespec.forward.cuda import CudaForward
    from codespec.policy.tree import VerifyTree

    os.environ.update(env)  # the backend the load builds takes them
    reused = loaded is not None
    if not reused:
        loaded = forward.load(Settings(model=model_dir, device="cuda", dtype="bfloat16",
                                       cache_dir="/tmp/codespec-cache"), progress=False, transformers=True)
    # a backend of this env's own where tiles are given or the load was another env's
    backend = CudaForward(loaded.model, tiles=tiles) if tiles or reused else loaded.forward
    cache = Engine(backend, loaded.tokenizer, eos_token_ids=[], slots=1).cache
    generator = torch.Generator().manual_seed(4)
    vocab = loaded.model.config.vocab_size
    prompt = torch.randint(0, vocab, (700,), generator=generator).tolist()
    cache.acquire(prompt)
    backend.prefill(cache, 0, prompt, 0)
    logits = backend.logits(cache, [(0, len(prompt), random_tree(generator, vocab))])
    step = backend.logits(cache, [(0, len(prompt), VerifyTree.chain(int(logits[0].argmax())))])  # a narrow one too
    torch.cuda.synchronize()
    return {"ok": bool(torch.isfinite(logits.float()).all() and torch.isfinite(step.float()).all()),
            "attention": backend.attention, "fused": backend.fused, "rows": int(logits.shape[0]),
            "lm_screen": backend.screen is not None, "loaded": loaded}


def candidates_part(model_dir: str) -> dict[str, Any]:
    """The candidates without lm_head's screen, then (where they ran) each of TRIED_APART,
    the model loaded once: each one's failure reported apart, the others' standing."""
    without = {name: value for name, value in EVERY_NARROW.items() if name not in LM_SCREEN}
    result = fused_part(model_dir, without, EVERY_TILES)
    if result["ok"]:
        for name, env, tiles, _ in TRIED_APART:
            try:
                tried = fused_part(model_dir, env, tiles, loaded=result["loaded"])
            except Exception as error:  # its own failure, in one line: the check turns it off
                tried = {"ok": False, "error": f"{type(error).__name__}: {str(error)[:300]}"}
            tried.pop("loaded", None)
            result[name] = tried
    return result


def main() -> None:
    part, model_dir = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else ""
    if part not in PARTS:
        raise SystemExit(f"no part {part!r}; the parts: {', '.join(PARTS)}")
    try:
        result = fused_part(model_dir, FIVE_LAUNCHES) if part == "fused" else candidates_part(model_dir)
        result.pop("loaded", None)
    except Exception as error:  # the part's failure, said in one line: the check turns it off
        result = {"ok": False, "error": f"{type(error).__name__}: {str(error)[:300]}"}
    print(json.dumps(result), flush=True)
    raise SystemExit(0 if result["ok"] else 1)


if __name__ == "__main__":
    main()
