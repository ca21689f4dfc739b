"""Prometheus metrics, one registry per app (no module globals: tests build many apps)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from codespec.engine.stats import GenerationStats

_PASS_BUCKETS = (1, 1.5, 2, 3, 4, 6, 8, 12, 16, 24, 33)
_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("codespec_requests", "HTTP requests by route and status", ["route", "status"],
                                registry=r)
        self.tokens = Counter("codespec_generated_tokens", "Tokens generated", registry=r)
        self.prompt_tokens = Counter("codespec_prompt_tokens", "Prompt tokens processed", registry=r)
        self.verify_passes = Counter("codespec_verify_passes", "Verify passes (decode steps)", registry=r)
        self.draft_tokens = Counter("codespec_draft_tokens", "Draft tokens proposed", registry=r)
        self.accepted_draft_tokens = Counter("codespec_accepted_draft_tokens", "Draft tokens accepted", registry=r)
        self.accepted_per_pass = Histogram("codespec_accepted_tokens_per_pass",
                                           "Mean tokens committed per verify pass, per request",
                                           buckets=_PASS_BUCKETS, registry=r)
        self.ttft = Histogram("codespec_time_to_first_token_seconds", "Time to first token",
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.inter_token = Histogram("codespec_inter_token_latency_seconds",
                                     "Wall time per generated token after the first, per request",
                                     buckets=_LATENCY_BUCKETS, registry=r)
        self.queue_depth = Gauge("codespec_queue_depth", "Requests waiting for a generation slot", registry=r)
        self.active = Gauge("codespec_active_requests", "Requests generating", registry=r)
        self.degraded = Gauge("codespec_forward_degraded", "1 when codespec's C kernels could not be built or "
                              "loaded and the passes run a slower route (/health says why)", registry=r)
        self.draft_budget = Histogram("codespec_draft_budget_tokens",
                                      "Draft tokens the policy (goodput controller) gave each verify pass",
                                      buckets=(0, 1, 2, 4, 8, 12, 16, 32, 64), registry=r)
        self.cached_prompt_tokens = Counter("codespec_cached_prompt_tokens",
                                            "Prompt tokens whose KV was reused from an earlier request",
                                            registry=r)
        self.lsp_completions = Counter("codespec_lsp_completions", "Inline completions shown and accepted "
                                       "in editors (codespec lsp --server)", ["outcome"], registry=r)
        self.index_tokens = Gauge("codespec_index_tokens", "Tokens in the suffix index", ["part"], registry=r)

    def observe(self, stats: GenerationStats) -> None:
        self.tokens.inc(stats.generated_tokens)
        self.prompt_tokens.inc(stats.prompt_tokens)
        self.verify_passes.inc(stats.verify_passes)
        self.draft_tokens.inc(stats.draft_tokens)
        self.accepted_draft_tokens.inc(stats.accepted_draft_tokens)
        if stats.verify_passes:
            self.accepted_per_pass.observe(stats.accepted_tokens_per_pass)
        for budget, passes in stats.drafted_per_pass.items():
            for _ in range(passes):
                self.draft_budget.observe(budget)
        self.cached_prompt_tokens.inc(stats.cached_prompt_tokens)
        self.ttft.observe(stats.ttft_s)
        if stats.generated_tokens > 1:
            self.inter_token.observe((stats.wall_s - stats.ttft_s) / (stats.generated_tokens - 1))
