"""`codespec bench host`: the engine's host path at GPU-shaped pass costs, on any machine.

The verify suite's systems (bench/batch_bench.py) on its request sets, with the model
replaced by `OracleForward` (bench/oracle.py): each request's greedy output is measured
once with the real model (plain decoding, one request at a time), then every system
drafts, accepts and commits as it would with the model while each pass waits a
GPU-like `pass_s` per bucket of rows, spinning as CUDA's synchronisation does. What is
left to time is the engine itself:

- `host ms`: the engine's time per verify pass outside the forward's calls (drafting,
  the controller, trees, acceptance, commits; stats.HostClock), with nothing else on the
  host, as while a GPU computes;
- `agg tok/s`: what the run would give on a device whose passes cost `pass_s`, with this
  machine's host: where speculation wins at batch 1 and loses at batch 8, the host is why.

Every output must equal the model's greedy output (`identical`): the oracle replays it
only along paths the engine accepts correctly.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Sequence

from codespec.bench.batch_bench import BatchResult, run_verify_bench
from codespec.bench.oracle import OracleForward
from codespec.bench.request_sets import Workload
from codespec.engine.engine import Engine, GenerationConfig
from codespec.engine.kvcache import SlotCache

H100_STEP_MS = 1.45  # a plain step of the default model on an H100 (docs/gpu.md; 2026-11-26)
H100_ROW_US = 3.0  # each further row of a pass there: (1.63 - 1.34 ms - ~0.09 of host layout) / 63


def greedy_sequences(engine: Engine, request_sets: dict[str, list[Workload]]
                     ) -> tuple[dict[tuple[int, ...], list[int]], int | None]:
    """Each request's prompt with its whole greedy sequence (prompt, output, and the end of
    sequence where the output ended on it), by plain decoding on `engine`; and that id
    (None for a model without one: its outputs end by length alone)."""
    eos = min(engine.eos_token_ids, default=None)
    sequences: dict[tuple[int, ...], list[int]] = {}
    requests = [w for ws in request_sets.values() for w in ws]
    for i, request in enumerate(requests):
        print(f"  greedy output {i + 1}/{len(requests)}", file=sys.stderr, flush=True)
        out = engine.generate(request.prompt_ids, GenerationConfig(request.max_new_tokens, speculate=False))
        ended = [eos] if out.finish_reason == "stop" else []
        sequences[tuple(request.prompt_ids)] = [*request.prompt_ids, *out.token_ids, *ended]
    return sequences, eos


def run_host_bench(
    sequences: dict[tuple[int, ...], list[int]],
    eos: int | None,
    tokenizer: Any,
    request_sets: dict[str, list[Workload]],
    proposers: dict[str, Any],
    batches: Sequence[int],
    *,
    pass_s: float,
    bucket: int,
    row_s: float = 0.0,
    chunk: int,
    repeat: int = 1,
    on_result: Callable[[BatchResult], None] | None = None,
    look_ahead: bool | None = None,
) -> list[BatchResult]:
    """Every verify-suite system over the oracle (module docstring); each result's
    `identical` also requires `none`'s outputs to be the greedy outputs themselves."""
    oracle = OracleForward(sequences, eos_id=eos, pass_s=pass_s, bucket=bucket, row_s=row_s)
    requests = [w for ws in request_sets.values() for w in ws]
    longest = max(len(w.prompt_ids) + w.max_new_tokens for w in requests)
    cache = SlotCache(oracle.config, slots=max(len(ws) for ws in request_sets.values()) + 1,
                      slot_tokens=longest + 64, dtype=oracle.kv_dtype, device=oracle.device, chunk=chunk)
    engines: dict[tuple[str, str], Engine] = {}

    def engine_for(set_name: str, policy: Any) -> Engine:
        key = (set_name, policy.name)
        if key not in engines:
            engines[key] = Engine(oracle, tokenizer, proposers[set_name], max_draft_tokens=policy.max_draft_tokens,
                                  draft_policy=policy.draft_policy, cache=cache, look_ahead=look_ahead)
        return engines[key]

    results = run_verify_bench(engine_for, request_sets, batches, repeat=repeat, on_result=on_result)
    for result in results:
        expected = [tuple(sequences[tuple(w.prompt_ids)][len(w.prompt_ids):]) for w in request_sets[result.request_set]]
        # a greedy sequence ends with the end of sequence, a generation's tokens never do
        result.identical = result.identical and all(
            out == want or (eos is not None and want[-1:] == (eos,) and out == want[:-1])
            for out, want in zip(result.outputs, expected))
    return results
