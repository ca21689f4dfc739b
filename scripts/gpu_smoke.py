"""The `smoke` stage of scripts/gpu_check.py (session 39): the kernels no GPU has run yet,
each once, in a process of its own, before the check's own process launches them.

Why. A kernel that faults on the device (an illegal address, a misaligned access)
leaves the process's CUDA context unusable: every later launch fails, so one untried
kernel would cost every stage after it, the whole device call. Here each part runs in a
fresh process; the check reads which passed and turns off what failed for the rest of
the run (gpu_step.NO_WALK, gpu_step.NO_FUSED). What compiles here stays in Triton's
cache for the check's process: the smoke costs the imports and a few launches.

Parts (`python scripts/gpu_smoke.py PART MODEL_DIR`, one JSON line out, exit 1 on a
failure):
* `walk`: attention's walk schedule (kernels/_triton_walk.py) over a pass of rows of one
  and of two chunks, with a padding row, against the reference, launched plain and as
  a programmatic dependent (warming its keys before the wait: sm_90 and later); its
  counts left zero;
* `fused`: the five-launch layers (the products' epilogue inputs read after the wait,
  the fold's one-round-trip combine) on the random model: a prompt prefilled, then a
  tree pass, its logits finite."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import torch

from gpu_step import FIVE_LAUNCHES

PARTS = ("walk", "fused")


def walk_part() -> dict[str, Any]:
    from codespec.kernels.row_attention import KEY_BLOCK, WALK_BLOCKS, row_attention, row_attention_ref

    torch.manual_seed(3)
    positions = KEY_BLOCK * WALK_BLOCKS * 2 + 64
    keys, values = (torch.randn(2, 2, positions, 64, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    rows = 64
    query = torch.randn(rows, 14, 64, device="cuda", dtype=torch.bfloat16)
    context = torch.randint(1, positions - 64, (rows,), device="cuda")
    context[0], context[-1] = KEY_BLOCK * WALK_BLOCKS + 7, 0  # two chunks; padding
    path_len = torch.randint(0, 9, (rows,), device="cuda")
    path_len[-1] = 0
    path = (positions - 64 + torch.arange(8, device="cuda")).repeat(rows, 1).contiguous()
    slots = torch.randint(0, 2, (rows,), device="cuda")
    counts = torch.zeros(rows * 2, dtype=torch.int32, device="cuda")
    ref = row_attention_ref(query, keys, values, slots, context, path, path_len, 0.125)
    result: dict[str, Any] = {}
    for pdl in (False, torch.cuda.get_device_capability() >= (9, 0)):
        got = row_attention(query, keys, values, slots=slots, context=context, path=path, path_len=path_len,
                            scale=0.125, schedule="walk", counts=counts, pdl=pdl)
        torch.cuda.synchronize()
        name = "pdl" if pdl else "plain"
        result[f"{name}_relative_error"] = float((got.float() - ref.float()).norm() / ref.float().norm())
        result[f"{name}_counts_left_zero"] = not bool(counts.any())
    result["ok"] = all(value < 1e-2 for key, value in result.items() if key.endswith("error")) and \
        all(value for key, value in result.items() if key.endswith("zero"))
    return result


def fused_part(model_dir: str) -> dict[str, Any]:
    from codespec import forward
    from codespec.engine import Engine
    from codespec.settings import Settings

    from gpu_measure import random_tree

    os.environ.update(FIVE_LAUNCHES)  # the backend the load builds takes them
    loaded = forward.load(Settings(model=model_dir, device="cuda", dtype="bfloat16",
                                   cache_dir="/tmp/codespec-cache"), progress=False, transformers=True)
    backend = loaded.forward
    cache = Engine(backend, loaded.tokenizer, eos_token_ids=[], slots=1).cache
    generator = torch.Generator().manual_seed(4)
    vocab = loaded.model.config.vocab_size
    prompt = torch.randint(0, vocab, (700,), generator=generator).tolist()
    cache.acquire(prompt)
    backend.prefill(cache, 0, prompt, 0)
    logits = backend.logits(cache, [(0, len(prompt), random_tree(generator, vocab))])
    torch.cuda.synchronize()
    return {"ok": bool(torch.isfinite(logits.float()).all()), "attention": backend.attention,
            "fused": backend.fused, "rows": int(logits.shape[0])}


def main() -> None:
    part, model_dir = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else ""
    if part not in PARTS:
        raise SystemExit(f"no part {part!r}; the parts: {', '.join(PARTS)}")
    try:
        result = walk_part() if part == "walk" else fused_part(model_dir)
    except Exception as error:  # the part's failure, said in one line: the check turns it off
        result = {"ok": False, "error": f"{type(error).__name__}: {str(error)[:300]}"}
    print(json.dumps(result), flush=True)
    raise SystemExit(0 if result["ok"] else 1)


if __name__ == "__main__":
    main()
