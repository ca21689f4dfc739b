"""Run vLLM once (a fresh process: vLLM's engine owns its workers) and print JSON.

    python vllm_worker.py REQUEST.json     # {"model", "prompts": [[ids]], "max_tokens",
                                           #  "speculative_config": {...} | null}

Prints {"outputs": [[ids]], "metrics": {name: value}, "seconds"}; the speculative
metrics are vLLM's own counters (drafts, draft tokens, accepted tokens).
"""

from __future__ import annotations

import json
import sys
import time


def main() -> None:
    from vllm import LLM, SamplingParams

    request = json.loads(open(sys.argv[1]).read())
    llm = LLM(model=request["model"], dtype="bfloat16", max_model_len=request.get("max_model_len", 4096),
              enforce_eager=True, gpu_memory_utilization=request.get("memory", 0.2), disable_log_stats=False,
              speculative_config=request.get("speculative_config"), seed=0)
    params = SamplingParams(temperature=0, max_tokens=request["max_tokens"])
    started = time.perf_counter()
    results = llm.generate([{"prompt_token_ids": ids} for ids in request["prompts"]], params, use_tqdm=False)
    seconds = time.perf_counter() - started
    metrics = {m.name: getattr(m, "value", None) for m in llm.get_metrics() if m.name.startswith("vllm:spec_decode")}
    outputs = [list(r.outputs[0].token_ids) for r in results]
    print("RESULT " + json.dumps({"outputs": outputs, "metrics": metrics, "seconds": seconds}), flush=True)


if __name__ == "__main__":  # vLLM spawns its engine process: the guard is required
    main()
