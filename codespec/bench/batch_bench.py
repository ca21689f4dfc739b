"""`codespec bench verify`: draft policies side by side, one request at a time and many at once.

Systems, all codespec's verifier on the same model and cache: `none` (speculation off),
`chain-4/8/16` (fixed draft lengths), `tree` (16-node token trees), `goodput` (the
controller, up to 16 nodes). Each runs every request set alone (batch 1, one request
after another) and through the scheduler at each larger batch size (every request
submitted together, up to `batch` decoding at once, the others joining as they finish:
continuous batching). The KV cache is cleared before every
run, so no system profits from another's prompts. With `--repeat N` the systems run N
times, interleaved, and each is reported by its median run.

Reported per (set, batch, system): aggregate tokens/s (all tokens / wall time of the
run), the median request's tokens/s (its tokens / its own latency), p50/p95 request
latency, time to first token, accepted tokens per verify pass, the mean draft budget
per pass, the engine's host time per pass (outside the forward's calls: stats.HostClock),
and whether every output equals `none`'s in the same batch mode.
"""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

from codespec.bench.request_sets import Workload, edit_set, repo_fim_set
from codespec.engine.engine import Engine, Generation, GenerationConfig
from codespec.engine.scheduler import Scheduler

FIXED_LENGTHS = (4, 8, 16)
TREE_NODES = 16


@dataclass(frozen=True)
class Policy:
    name: str
    draft_policy: str
    max_draft_tokens: int
    speculate: bool = True


def policies() -> list[Policy]:
    return [Policy("none", "chain", 0, speculate=False),
            *(Policy(f"chain-{k}", "chain", k) for k in FIXED_LENGTHS),
            Policy("tree", "tree", TREE_NODES),
            Policy("goodput", "goodput", TREE_NODES)]


@dataclass
class BatchResult:
    request_set: str
    batch: int
    system: str
    outputs: list[tuple[int, ...]]
    wall_s: float
    latencies: list[float]
    ttfts: list[float]
    passes: int
    committed_in_passes: int
    draft_tokens: int
    identical: bool = True
    wall_runs: list[float] = field(default_factory=list)  # every repeat's wall time
    # the engine's time per verify pass outside the forward's calls (drafting, the
    # controller, trees, acceptance): on a GPU the device waits for it
    host_ms_per_pass: float = 0.0
    # drafting ahead while a pass ran (engine/ahead.py): its time, and the share of its
    # guesses that the passes then committed
    overlapped_ms_per_pass: float = 0.0
    guesses_taken: float | None = None

    @property
    def tokens(self) -> int:
        return sum(len(o) for o in self.outputs)

    def to_json(self) -> dict[str, Any]:
        per_request = [len(o) / lat for o, lat in zip(self.outputs, self.latencies) if lat > 0]
        latencies = sorted(self.latencies)
        return {
            "set": self.request_set,
            "batch": self.batch,
            "system": self.system,
            "tokens": self.tokens,
            "wall_s": round(self.wall_s, 3),
            "aggregate_tokens_per_s": round(self.tokens / self.wall_s, 3),
            "request_tokens_per_s_p50": round(statistics.median(per_request), 3),
            "latency_p50_s": round(statistics.median(latencies), 3),
            "latency_p95_s": round(latencies[min(len(latencies) - 1, int(0.95 * len(latencies)))], 3),
            "ttft_p50_s": round(statistics.median(self.ttfts), 3),
            "accepted_tokens_per_pass": round(self.committed_in_passes / max(self.passes, 1), 3),
            "draft_budget_mean": round(self.draft_tokens / max(self.passes, 1), 3),
            "host_ms_per_pass": round(self.host_ms_per_pass, 3),
            "overlapped_ms_per_pass": round(self.overlapped_ms_per_pass, 3),
            "guesses_taken": None if self.guesses_taken is None else round(self.guesses_taken, 3),
            "identical_to_none": self.identical,
            "wall_s_runs": self.wall_runs,
        }


def _collect(name: str, batch: int, system: str, outs: Sequence[Generation], wall: float,
             latencies: list[float]) -> BatchResult:
    return BatchResult(
        name, batch, system, [tuple(o.token_ids) for o in outs], wall, latencies,
        [o.stats.ttft_s for o in outs],
        sum(o.stats.verify_passes for o in outs),
        sum(o.stats.committed_in_passes for o in outs),
        sum(o.stats.draft_tokens for o in outs),
    )


Timed = tuple[list[Generation], float, list[float]]  # outputs, wall time, per-request latencies


def run_alone(engine: Engine, requests: Sequence[Workload], speculate: bool) -> Timed:
    outs, latencies = [], []
    began = time.perf_counter()
    for request in requests:
        start = time.perf_counter()
        config = GenerationConfig(request.max_new_tokens, speculate=speculate)
        outs.append(engine.generate(request.prompt_ids, config))
        latencies.append(time.perf_counter() - start)
    return outs, time.perf_counter() - began, latencies


def run_together(engine: Engine, requests: Sequence[Workload], speculate: bool, batch: int | None = None) -> Timed:
    """Every request submitted at once; up to `batch` (default: all) decode together,
    the rest wait in the scheduler's queue and join as others finish."""
    # driven on this thread, the one that loaded the model and calibrated: a second
    # thread would run torch on a second, slower thread pool (scheduler.py)
    scheduler = Scheduler(engine, max_active=batch or len(requests), max_waiting=len(requests), thread=False)
    finished: dict[int, Any] = {}
    ended: dict[int, float] = {}

    def on_done(i: int) -> Callable[[Any], None]:
        def done(outcome: Any) -> None:
            finished[i], ended[i] = outcome, time.perf_counter()
        return done

    began = time.perf_counter()
    for i, request in enumerate(requests):
        scheduler.submit(request.prompt_ids, GenerationConfig(request.max_new_tokens, speculate=speculate),
                         on_tokens=lambda tokens: None, on_done=on_done(i))
    scheduler.drain()
    wall = time.perf_counter() - began
    outs = [finished[i] for i in range(len(requests))]
    for out in outs:
        if isinstance(out, BaseException):
            raise out
    return outs, wall, [ended[i] - began for i in range(len(requests))]


def verify_sets(tok: Any, settings: Any, set_names: Sequence[str], count: int,
                new_tokens: int) -> tuple[dict[str, list[Workload]], dict[str, Any]]:
    """The suite's request sets by name, each with its proposer: `edit` drafts from the
    request's own context, `fim-repo` from an index of the repository's other files too
    (past generations not recorded: a system must not draft from another's outputs)."""
    from codespec.index import SuffixIndex
    from codespec.policy.proposer import IndexedProposer, PromptLookupProposer
    from codespec.prompts import encode_texts

    request_sets: dict[str, list[Workload]] = {}
    proposers: dict[str, Any] = {}
    if "edit" in set_names:
        request_sets["edit"] = edit_set(tok, count, new_tokens)
        proposers["edit"] = PromptLookupProposer(settings.min_match_tokens, settings.max_match_tokens)
    if "fim-repo" in set_names:
        requests, files = repo_fim_set(tok, count, new_tokens)
        print(f"indexing {len(files)} repository files (targets excluded)...", file=sys.stderr, flush=True)
        paths = sorted(files)
        index = SuffixIndex.build(dict(zip(paths, encode_texts(tok, [files[p] for p in paths]))))
        request_sets["fim-repo"] = requests
        proposers["fim-repo"] = IndexedProposer(index, settings.min_match_tokens, settings.max_match_tokens,
                                                record_generations=False)
    return request_sets, proposers


def run_verify_bench(
    engines: Callable[[str, Policy], Engine],
    request_sets: dict[str, list[Workload]],
    batches: Sequence[int],
    repeat: int = 1,
    on_result: Callable[[BatchResult], None] | None = None,
) -> list[BatchResult]:
    """Every system on every set and batch size, `repeat` times, interleaved (all
    systems once, then again) so that a noisy neighbour hits all alike; each system is
    reported by its median-wall run, with every run's wall time in `wall_runs`."""
    results: list[BatchResult] = []
    for set_name, requests in request_sets.items():
        for batch in batches:
            runs: dict[str, list[BatchResult]] = {p.name: [] for p in policies()}
            for _ in range(repeat):
                for policy in policies():
                    engine = engines(set_name, policy)
                    engine.calibrate()  # start-up work, not part of any request
                    engine.cache.clear()
                    clock = replace(engine.clock)
                    if batch == 1:
                        outs, wall, latencies = run_alone(engine, requests, policy.speculate)
                    else:
                        outs, wall, latencies = run_together(engine, requests, policy.speculate, batch)
                    result = _collect(set_name, batch, policy.name, outs, wall, latencies)
                    spent = engine.clock.since(clock)
                    result.host_ms_per_pass = spent.host_ms_per_pass()
                    result.overlapped_ms_per_pass = 1e3 * spent.overlapped_s / spent.passes if spent.passes else 0.0
                    result.guesses_taken = spent.guesses_taken / spent.guesses if spent.guesses else None
                    runs[policy.name].append(result)
                    if on_result:
                        on_result(result)
            reference = runs["none"][0].outputs
            for name, done in runs.items():
                median = sorted(done, key=lambda r: r.wall_s)[len(done) // 2]
                median.identical = all(r.outputs == reference for r in done)
                median.wall_runs = [round(r.wall_s, 3) for r in done]
                results.append(median)
    return results


def verify_results(loaded: Any, settings: Any, set_names: Sequence[str], batches: Sequence[int], count: int,
                   new_tokens: int, repeat: int = 1,
                   on_result: Callable[[BatchResult], None] | None = None) -> list[BatchResult]:
    """The suite on a loaded model: every policy's engine shares one KV cache (cleared
    before each run), each set its own proposer."""
    from codespec.engine.engine import look_ahead_of
    from codespec.engine.kvcache import SlotCache
    from codespec.policy.warm import warm_up

    forward, tok = loaded.forward, loaded.tokenizer
    request_sets, proposers = verify_sets(tok, settings, set_names, count, new_tokens)
    longest = max(len(w.prompt_ids) + w.max_new_tokens for ws in request_sets.values() for w in ws)
    cache = SlotCache(forward.config, slots=count + 1, slot_tokens=longest + 64, dtype=forward.kv_dtype,
                      device=forward.device, chunk=settings.prefill_chunk_tokens)
    engines: dict[tuple[str, str], Engine] = {}

    def engine_for(set_name: str, policy: Policy) -> Engine:
        key = (set_name, policy.name)
        if key not in engines:
            engines[key] = Engine(forward, tok, proposers[set_name], max_draft_tokens=policy.max_draft_tokens,
                                  draft_policy=policy.draft_policy, cache=cache, look_ahead=look_ahead_of(settings))
        return engines[key]

    warm_up()  # as serve and lsp do at start-up: else the first drafting system loads numba's kernels in its run
    return run_verify_bench(engine_for, request_sets, batches, repeat=repeat, on_result=on_result)


def format_verify_table(results: Sequence[BatchResult]) -> str:
    header = (f"{'set':<9}{'batch':>6}  {'system':<10}{'agg tok/s':>10}{'req tok/s':>10}{'p50 s':>8}{'p95 s':>8}"
              f"{'ttft s':>8}{'acc/pass':>9}{'budget':>8}{'host ms':>8}  identical")
    lines = [header, "-" * len(header)]
    for r in results:
        j = r.to_json()
        lines.append(
            f"{r.request_set:<9}{r.batch:>6}  {r.system:<10}{j['aggregate_tokens_per_s']:>10.1f}"
            f"{j['request_tokens_per_s_p50']:>10.1f}{j['latency_p50_s']:>8.1f}{j['latency_p95_s']:>8.1f}"
            f"{j['ttft_p50_s']:>8.2f}{j['accepted_tokens_per_pass']:>9.2f}{j['draft_budget_mean']:>8.1f}"
            f"{j['host_ms_per_pass']:>8.2f}  {'yes' if r.identical else 'NO'}"
        )
    return "\n".join(lines)


def bar_checks(results: Sequence[BatchResult]) -> dict[str, Any]:
    """The verifier issue's bar, read off one run."""
    checks: dict[str, Any] = {"identical": all(r.identical for r in results)}
    widest = max(r.batch for r in results)
    for set_name in sorted({r.request_set for r in results}):
        row = {r.system: r for r in results if r.request_set == set_name and r.batch == widest}
        if "goodput" in row:
            agg = {name: r.tokens / r.wall_s for name, r in row.items()}
            best_fixed = max((agg[n] for n in agg if n.startswith("chain-")), default=0.0)
            checks[f"{set_name}: goodput aggregate >= none and best fixed (batch {widest})"] = (
                agg["goodput"] >= agg.get("none", 0) and agg["goodput"] >= best_fixed)
        one = {r.system: r for r in results if r.request_set == set_name and r.batch == 1}
        # the bar is repository FIM's, where a continuation has several likely branches; an
        # edit's copy is one chain, which a 16-node tree spreads over branches it does not need
        if set_name.startswith("fim") and "tree" in one and "chain-16" in one:
            tree, chain = (one[n].committed_in_passes / max(one[n].passes, 1) for n in ("tree", "chain-16"))
            checks[f"{set_name}: tree accepted/pass > chain-16 (batch 1)"] = tree > chain
    return checks
