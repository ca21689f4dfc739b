"""`codespec bench`: every workload, every system, one run, same model and prompts.

Systems (all greedy, batch 1, one request after another as a user or agent sends them):

    plain              codespec's engine with speculation off and no prompt cache:
                       what plain greedy decoding costs; every other output must equal it
    hf_prompt_lookup   Hugging Face transformers' prompt lookup (generate, 10 tokens)
    hf_assisted        transformers' assisted generation, the draft model as its assistant
    codespec-prompt    drafts from the request's own context, chains of up to 16
    codespec-index     + the repository index and past generations
    codespec-tree      + token trees of up to 16 nodes
    codespec           + the goodput controller: codespec serve's defaults
    arctic-tree        arctic-inference's suffix tree drafting into codespec's verifier
                       (trees of up to 16 nodes), when it is installed
    llamacpp           llama.cpp's llama-server on the same weights (BF16 GGUF), plain
    llamacpp-simple    llama-server with n-gram lookup: ngram-simple, ngram-mod, ngram-map-k
    llamacpp-mod       (16-token drafts; `llamacpp-lookup` picks all three), when
    llamacpp-map-k     scripts/install-bench-peers.sh has built it (bench/llamacpp.py)

Every codespec system keeps its KV prompt cache and its past generations from one
request of a workload to the next, as `codespec serve` does, and starts each workload
from nothing (cache cleared, fresh dynamic index, fresh acceptance statistics). With
`--repeat N` the systems run N times, interleaved (all systems once, then again), and
each is reported by its median run.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

from codespec.policy import controller
from codespec.bench import llamacpp
from codespec.bench.peers import ArcticProposer, arctic_available, hf_assisted, hf_prompt_lookup
from codespec.bench.sessions import Workload
from codespec.bench.systems import BF16_REFERENCE, ALIASES, PLAIN, SYSTEM_NAMES, SYSTEMS, SystemSpec  # noqa: F401 (re-exported)
from codespec.engine.engine import Engine, GenerationConfig
from codespec.index import SuffixIndex
from codespec.policy.warm import warm_up
from codespec.engine.kvcache import SlotCache
from codespec.prompts import encode_texts
from codespec.policy.proposer import IndexedProposer, PromptLookupProposer, Proposer


@dataclass(frozen=True)
class Request:
    step: str
    prompt_tokens: int
    token_ids: tuple[int, ...]
    latency_s: float
    ttft_s: float | None
    passes: int = 0
    committed_in_passes: int = 0
    draft_tokens: int = 0
    cached_prompt_tokens: int = 0


@dataclass
class Run:
    workload: str
    system: str
    requests: list[Request]
    peak_rss_mb: float | None

    @property
    def wall_s(self) -> float:
        return sum(r.latency_s for r in self.requests)

    @property
    def tokens(self) -> int:
        return sum(len(r.token_ids) for r in self.requests)


@dataclass
class Result:
    workload: str
    system: str
    runs: list[Run] = field(default_factory=list)
    identical_rate: float = 1.0
    ratio_vs_plain: float = 1.0
    # per request (step name): its output equals plain greedy's in every run
    identical: dict[str, bool] = field(default_factory=dict)
    # tokens before the first difference from plain's output, over plain's tokens
    token_agreement: float = 1.0

    @property
    def median(self) -> Run:
        return sorted(self.runs, key=lambda r: r.wall_s)[len(self.runs) // 2]

    @property
    def tokens_per_s(self) -> float:
        run = self.median
        return run.tokens / run.wall_s if run.wall_s > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        run = self.median
        latencies = sorted(r.latency_s for r in run.requests)
        ttfts = [r.ttft_s for r in run.requests if r.ttft_s is not None]
        passes = sum(r.passes for r in run.requests)
        return {
            "workload": self.workload,
            "system": self.system,
            "requests": len(run.requests),
            "tokens": run.tokens,
            "wall_s": round(run.wall_s, 3),
            "tokens_per_s": round(self.tokens_per_s, 3),
            "ratio_vs_plain": round(self.ratio_vs_plain, 3),
            "accepted_tokens_per_pass": round(sum(r.committed_in_passes for r in run.requests) / passes, 3)
            if passes else None,
            # rows a pass verified beyond each request's pending token: what drafting cost
            "draft_tokens_per_pass": round(sum(r.draft_tokens for r in run.requests) / passes, 3) if passes else None,
            "ttft_p50_s": round(statistics.median(ttfts), 4) if ttfts else None,
            # prompt tokens read (not taken from a cache) per second of time to first token:
            # prefill speed as each system delivers it
            "prefill_tokens_per_s": _prefill_rate(run.requests),
            "latency_p50_s": round(statistics.median(latencies), 3),
            "latency_p95_s": round(_percentile(latencies, 0.95), 3),
            "identical_rate": round(self.identical_rate, 4),
            "identical_per_request": dict(self.identical),
            # which request was slow, and in how many passes (a first-call cost shows here)
            "latency_per_request_s": [round(r.latency_s, 3) for r in run.requests],  # in request order
            "passes_per_request": [r.passes for r in run.requests],
            "token_agreement": round(self.token_agreement, 4),
            "peak_rss_mb": None if run.peak_rss_mb is None else round(run.peak_rss_mb, 1),
            "cached_prompt_tokens": sum(r.cached_prompt_tokens for r in run.requests),
            "wall_s_runs": [round(r.wall_s, 3) for r in self.runs],
        }


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (p95 of 4 values is the largest)."""
    return sorted_values[max(0, math.ceil(q * len(sorted_values)) - 1)]


class Context:
    """The loaded model and what systems share: one KV cache, engines per policy, the
    workload's static index (built once; each run gets a fresh dynamic side)."""

    def __init__(self, loaded: Any, settings: Any, slot_tokens: int) -> None:
        self.loaded = loaded
        self.settings = settings
        forward = loaded.forward
        self.cache = SlotCache(forward.config, slots=2, slot_tokens=slot_tokens, dtype=forward.kv_dtype,
                               device=forward.device, chunk=settings.prefill_chunk_tokens)
        self.engines: dict[str, Engine] = {}
        self._drafter: Any = None  # the draft model's (engine/drafter.py), loaded when a system needs it
        self._assistant: Any = None  # its transformers model (hf_assisted)
        self.indexed: dict[str, tuple[Any, dict[str, list[int]]]] = {}
        self.eos_token_ids = self.engine("chain").eos_token_ids

    def engine(self, policy: str, quantize: str | None = None, draft_model: bool = False) -> Engine:
        key = (policy if quantize is None else f"{policy}/{quantize}") + ("+draft" if draft_model else "")
        if key not in self.engines:
            self.engines[key] = Engine(self._forward(quantize), self.loaded.tokenizer, PromptLookupProposer(),
                                       max_draft_tokens=self.settings.max_draft_tokens, draft_policy=policy,
                                       cache=self.cache, drafter=self.drafter() if draft_model else None)
            self.engines[key].calibrate()  # start-up work, outside every timed request
            warm_up()  # as serve and lsp do at start-up (engine/scheduler.start_scheduler)
        return self.engines[key]

    def drafter(self) -> Any:
        """The draft model `--draft-model` names (available_systems checked that one does)."""
        if self._drafter is None:
            from codespec.engine.drafter import load_drafter

            self._drafter = load_drafter(self.settings, self.loaded.tokenizer)
        return self._drafter

    def assistant(self) -> Any:
        """The draft model as transformers loads it, for transformers' assisted generation."""
        if self._assistant is None:
            from codespec.engine.drafter import draft_model_of
            from codespec.forward import select

            spec = draft_model_of(self.settings)
            self._assistant = select.load(self.settings.model_copy(update={"model": spec}), progress=False,
                                          transformers=True).model
        return self._assistant

    def _forward(self, quantize: str | None) -> Any:
        """The loaded backend, or the same model's with other weights (the bf16 reference of
        --quantize int8: the row decoder over the same transformers model)."""
        if quantize is None or quantize == self.settings.quantize:
            return self.loaded.forward
        from codespec.forward.select import of_model

        return of_model(self.loaded.model, quantize=quantize)

    def repository(self, workload: Workload) -> tuple[Any, dict[str, list[int]]]:
        """(static index, tokenized files) of the workload's repository."""
        if workload.name not in self.indexed:
            paths = sorted(workload.files)
            texts = [workload.files[p] for p in paths]
            tokens = dict(zip(paths, encode_texts(self.loaded.tokenizer, texts))) if texts else {}
            static = SuffixIndex.build(tokens).static if tokens else None
            self.indexed[workload.name] = (static, tokens)
        return self.indexed[workload.name]

    def proposer(self, spec: SystemSpec, workload: Workload) -> Proposer:
        match = dict(min_match_tokens=self.settings.min_match_tokens, max_match_tokens=self.settings.max_match_tokens)
        if spec.drafter == "prompt":
            return PromptLookupProposer(**match)
        static, tokens = self.repository(workload)
        if spec.drafter == "arctic":
            return ArcticProposer(tokens)
        return IndexedProposer(SuffixIndex(static), **match)  # a fresh dynamic side: no earlier run's outputs


def available_systems(names: Sequence[str], draft_model: str | None = None) -> tuple[list[SystemSpec], dict[str, str]]:
    """The chosen systems that can run here, and why the others cannot; `draft_model`:
    the draft model the settings name (drafter.draft_model_of), None: none."""
    skipped: dict[str, str] = {}
    names = [n for name in names for n in ALIASES.get(name, (name,))]
    chosen = [s for s in SYSTEMS if s.name == PLAIN or s.name in names]
    if draft_model is None:
        skipped.update({s.name: "no draft model for this model (--draft-model names one)"
                        for s in chosen if s.draft_model})
        chosen = [s for s in chosen if not s.draft_model]
    why = arctic_available()
    if why is not None and any(s.drafter == "arctic" for s in chosen):
        skipped["arctic-tree"] = why
        chosen = [s for s in chosen if s.drafter != "arctic"]
    why = llamacpp.llamacpp_available()
    if why is not None and any(s.kind == "llamacpp" for s in chosen):
        skipped.update({s.name: why for s in chosen if s.kind == "llamacpp"})
        chosen = [s for s in chosen if s.kind != "llamacpp"]
    return chosen, skipped


def run_llamacpp(ctx: Context, spec: SystemSpec, workload: Workload) -> Run:
    """One llama-server for the workload (started and stopped outside every timed
    request); passes are inferred: each commits its accepted draft tokens plus one."""
    import torch

    answers: list[str] = []
    samples: list[Request] = []
    with llamacpp.LlamaServer(spec.name, threads=torch.get_num_threads()) as server:
        for step in workload.steps:
            prompt = step.prompt(answers)
            out = server.complete(prompt, step.max_new_tokens, ctx.eos_token_ids)
            passes = max(len(out.token_ids) - out.accepted_draft_tokens, 0)
            samples.append(Request(step.name, len(prompt), tuple(out.token_ids), out.wall_s, out.ttft_s, passes,
                                   len(out.token_ids), out.draft_tokens))
            answers.append(ctx.loaded.tokenizer.decode(out.token_ids, skip_special_tokens=True))
    return Run(workload.name, spec.name, samples, None)  # its memory is another process's


def run_system(ctx: Context, spec: SystemSpec, workload: Workload) -> Run:
    if spec.kind == "llamacpp":
        return run_llamacpp(ctx, spec, workload)
    tokenizer = ctx.loaded.tokenizer
    engine = None if spec.kind == "hf" else ctx.engine("chain" if spec.kind == PLAIN else spec.policy, spec.quantize,
                                                         spec.draft_model)
    if engine is not None:
        engine.proposer = ctx.proposer(spec, workload) if spec.kind == "codespec" else PromptLookupProposer()
        engine.acceptance = controller.AcceptanceTable()
        engine.cache.clear()
        if engine.drafter is not None:
            engine.drafter.cache.clear()
    answers: list[str] = []
    samples: list[Request] = []
    _reset_peak_rss()
    for step in workload.steps:
        prompt = step.prompt(answers)
        if spec.kind == "hf":
            out = (hf_assisted(ctx.loaded.model, ctx.assistant(), prompt, step.max_new_tokens, ctx.eos_token_ids)
                   if spec.drafter == "assisted" else
                   hf_prompt_lookup(ctx.loaded.model, prompt, step.max_new_tokens, ctx.eos_token_ids))
            samples.append(Request(step.name, len(prompt), tuple(out.token_ids), out.wall_s, out.ttft_s))
            answers.append(tokenizer.decode(out.token_ids, skip_special_tokens=True))
            continue
        assert engine is not None
        if spec.kind == PLAIN:
            engine.cache.clear()
        began = time.perf_counter()
        gen = engine.generate(prompt, GenerationConfig(step.max_new_tokens, speculate=spec.kind != PLAIN))
        latency = time.perf_counter() - began
        s = gen.stats
        samples.append(Request(step.name, len(prompt), tuple(gen.token_ids), latency, s.ttft_s, s.verify_passes,
                                     s.committed_in_passes, s.draft_tokens, s.cached_prompt_tokens))
        answers.append(gen.text)
    return Run(workload.name, spec.name, samples, _peak_rss_mb())


def run_suite(ctx: Context, workloads: Sequence[Workload], systems: Sequence[SystemSpec], repeat: int,
              on_run: Callable[[Run], None] | None = None) -> list[Result]:
    assert systems[0].name == PLAIN, "plain runs first: ratios and identity are measured against it"
    results: list[Result] = []
    for workload in workloads:
        warm = Workload(workload.name, "", [replace(workload.steps[0], max_new_tokens=4)])
        run_system(ctx, systems[0], warm)  # first-call costs (allocator, kernel choice) stay out
        by_system = {s.name: Result(workload.name, s.name) for s in systems}
        for _ in range(repeat):
            for spec in systems:
                run = run_system(ctx, spec, workload)
                by_system[spec.name].runs.append(run)
                if on_run:
                    on_run(run)
        plain = by_system[PLAIN]
        reference = [r.token_ids for r in plain.runs[0].requests]
        for result in by_system.values():
            same = [r.token_ids == ref for run in result.runs for r, ref in zip(run.requests, reference)]
            result.identical_rate = sum(same) / len(same)
            for i, step in enumerate(workload.steps):
                result.identical[step.name] = all(run.requests[i].token_ids == reference[i] for run in result.runs)
            first = result.runs[0].requests
            result.token_agreement = sum(_common_prefix(r.token_ids, ref) for r, ref in zip(first, reference)) / max(
                1, sum(len(ref) for ref in reference))
            result.ratio_vs_plain = result.tokens_per_s / plain.tokens_per_s if plain.tokens_per_s else 0.0
        results.extend(by_system.values())
    return results


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many tokens two outputs share before their first difference.

    >>> _common_prefix([1, 2, 3], [1, 2, 4, 5])
    2
    """
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _prefill_rate(requests: Sequence[Request]) -> float | None:
    """Median over requests of prompt tokens read per second of time to first token.

    >>> _prefill_rate([Request("a", 300, (), 1.0, 0.5, cached_prompt_tokens=100), Request("b", 10, (), 1.0, None)])
    400.0
    """
    rates = [(r.prompt_tokens - r.cached_prompt_tokens) / r.ttft_s for r in requests
             if r.ttft_s and r.prompt_tokens > r.cached_prompt_tokens]
    return round(statistics.median(rates), 1) if rates else None


def format_table(results: Sequence[Result]) -> str:
    header = (f"{'workload':<9}{'system':<18}{'tokens':>7}{'tok/s':>8}{'vs plain':>9}{'acc/pass':>9}"
              f"{'ttft p50':>9}{'prefill/s':>10}{'p50 s':>7}{'p95 s':>7}{'same':>6}{'peak MB':>9}")
    lines = [header, "-" * len(header)]
    for r in results:
        j = r.to_json()
        atp = "-" if j["accepted_tokens_per_pass"] is None else f"{j['accepted_tokens_per_pass']:.2f}"
        ttft = "-" if j["ttft_p50_s"] is None else f"{j['ttft_p50_s']:.2f}"
        prefill = "-" if j["prefill_tokens_per_s"] is None else f"{j['prefill_tokens_per_s']:.0f}"
        peak = "-" if j["peak_rss_mb"] is None else f"{j['peak_rss_mb']:.0f}"
        lines.append(f"{r.workload:<9}{r.system:<18}{j['tokens']:>7}{j['tokens_per_s']:>8.1f}"
                     f"{j['ratio_vs_plain']:>8.2f}x{atp:>9}{ttft:>9}{prefill:>10}{j['latency_p50_s']:>7.2f}"
                     f"{j['latency_p95_s']:>7.2f}{j['identical_rate']:>6.0%}{peak:>9}")
    differing = [f"  {r.workload}/{r.system}: {', '.join(step for step, same in r.identical.items() if not same)}"
                 for r in results if not all(r.identical.values())]
    if differing:
        lines += ["requests whose output differs from plain greedy decoding:", *differing]
    for r in results:
        if r.system == BF16_REFERENCE.name:
            same = sum(r.identical.values())
            lines.append(f"  {r.workload}: int8 against bf16: {same} of {len(r.identical)} requests identical, "
                         f"{r.token_agreement:.0%} of the tokens before the first difference")
    return "\n".join(lines)


def bar_checks(results: Sequence[Result]) -> dict[str, bool]:
    """The benchmark issue's bar, read off this run."""
    by = {(r.workload, r.system): r for r in results}
    checks = {"greedy outputs of every codespec system identical to plain":
              all(r.identical_rate == 1.0 for r in results if r.system.startswith("codespec"))}
    if ("edit", "codespec") in by and ("edit", "hf_prompt_lookup") in by:
        checks["edit: codespec >= 1.5x HF prompt lookup"] = (
            by["edit", "codespec"].tokens_per_s >= 1.5 * by["edit", "hf_prompt_lookup"].tokens_per_s)
    if ("repo", "codespec") in by:
        checks["repo: codespec >= 2x plain"] = by["repo", "codespec"].ratio_vs_plain >= 2.0
    for workload in sorted({r.workload for r in results}):
        if (workload, "llamacpp") in by:
            checks[f"{workload}: codespec plain >= llama.cpp plain"] = (
                by[workload, PLAIN].tokens_per_s >= by[workload, "llamacpp"].tokens_per_s)
        lookups = [by[workload, name] for name in llamacpp.LOOKUP_SYSTEMS if (workload, name) in by]
        if lookups and (workload, "codespec") in by and workload in ("edit", "repo"):
            best = max(lookups, key=lambda r: r.tokens_per_s)
            checks[f"{workload}: codespec >= 1.5x llama.cpp's best lookup ({best.system})"] = (
                by[workload, "codespec"].tokens_per_s >= 1.5 * best.tokens_per_s)
    return checks


# -- peak memory: the process's resident high-water mark, reset per run (Linux) -----------
def _reset_peak_rss() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
    except OSError:
        pass


def _peak_rss_mb() -> float | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None
