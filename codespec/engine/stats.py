"""Per-request speculation statistics.

*Accepted tokens per pass* counts what a verify pass commits: its accepted draft tokens
plus the bonus token (Spec-Bench's "mean accepted tokens"). Plain decoding scores exactly
1.0; a pass that accepts 3 draft tokens scores 4. The first token, which comes from the
prefill and not from a verify pass, is not counted in it.

>>> s = GenerationStats(prompt_tokens=5)
>>> s.record_pass(drafted=4, committed=3); s.record_pass(drafted=0, committed=1)
>>> s.accepted_tokens_per_pass, s.histogram
(2.0, {1: 1, 3: 1})
"""

from __future__ import annotations

import os
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass
class GenerationStats:
    prompt_tokens: int
    generated_tokens: int = 0
    verify_passes: int = 0
    draft_tokens: int = 0  # draft tokens proposed (and verified)
    accepted_draft_tokens: int = 0
    committed_in_passes: int = 0
    committed_per_pass: Counter[int] = field(default_factory=Counter)
    accepted_by_source: Counter[str] = field(default_factory=Counter)  # draft tokens accepted, by index
    drafted_by_source: Counter[str] = field(default_factory=Counter)  # draft tokens verified, by index
    drafted_per_pass: Counter[int] = field(default_factory=Counter)  # draft budgets the passes used
    cached_prompt_tokens: int = 0  # prompt tokens whose KV came from an earlier request
    ttft_s: float = 0.0
    wall_s: float = 0.0

    def record_pass(self, drafted: int, committed: int, accepted: int | None = None, source: str = "") -> None:
        """Count a verify pass that proposed `drafted` tokens (from `source`) and
        committed `committed` (after stop conditions; `accepted` defaults to committed - 1)."""
        accepted = max(0, committed - 1) if accepted is None else accepted
        self.verify_passes += 1
        self.draft_tokens += drafted
        self.accepted_draft_tokens += accepted
        if drafted:
            self.accepted_by_source[source] += accepted
            self.drafted_by_source[source] += drafted
        self.committed_in_passes += committed
        self.committed_per_pass[committed] += 1
        self.drafted_per_pass[drafted] += 1

    @property
    def accepted_tokens_per_pass(self) -> float:
        return self.committed_in_passes / self.verify_passes if self.verify_passes else 0.0

    @property
    def histogram(self) -> dict[int, int]:
        return dict(sorted(self.committed_per_pass.items()))

    def to_json(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "generated_tokens": self.generated_tokens,
            "verify_passes": self.verify_passes,
            "accepted_tokens_per_pass": round(self.accepted_tokens_per_pass, 4),
            "accepted_tokens_histogram": {str(k): v for k, v in self.histogram.items()},
            "draft_tokens": self.draft_tokens,
            "accepted_draft_tokens": self.accepted_draft_tokens,
            "accepted_by_source": dict(self.accepted_by_source),
            "drafted_by_source": dict(self.drafted_by_source),
            "draft_budget_histogram": {str(k): v for k, v in sorted(self.drafted_per_pass.items())},
            "cached_prompt_tokens": self.cached_prompt_tokens,
            "ttft_s": round(self.ttft_s, 4),
            "wall_s": round(self.wall_s, 4),
            "tokens_per_s": round(self.generated_tokens / self.wall_s, 3) if self.wall_s else 0.0,
        }


def process_age() -> float:
    """Seconds since this process started (Linux: from /proc; elsewhere since codespec's
    CLI was imported, which misses the interpreter's own start-up)."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            started_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime", encoding="ascii") as f:
            uptime = float(f.read().split()[0])
        return uptime - started_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.perf_counter() - _IMPORTED


_IMPORTED = time.perf_counter()


def startup_report(imported: float, loading: float, loaded_at: float, started: float, ttft: float) -> dict[str, float]:
    """`generate --json`'s `startup` from process ages (`process_age`): after imports,
    around the model load, at the request's start, and its time to first token."""
    return {"imports_s": round(imported, 4), "model_load_s": round(loaded_at - loading, 4),
            "engine_s": round(started - loaded_at, 4), "first_token_s": round(started + ttft, 4)}


@dataclass
class HostClock:
    """Where an engine's steps spend their time: in the forward's passes (prefill and
    verify, up to their results on the host) or on the host around them (drafting, the
    controller, trees, acceptance, bookkeeping). On a GPU the host part is time the
    device waits: at batch 8 it took ~1.4 ms a pass on a 2-core CPU before the numba
    matcher, about what an H100 verify pass of the default model takes
    (docs/benchmarks.md)."""

    steps: int = 0
    passes: int = 0  # verify passes (a step verifies every prefilled run in one)
    step_s: float = 0.0  # inside Engine.step
    forward_s: float = 0.0  # of which inside the forward's calls
    overlapped_s: float = 0.0  # of which drafting ahead while a launched pass ran (engine/ahead.py)
    guesses: int = 0  # drafts made ahead
    guesses_taken: int = 0  # of which the pass committed the guessed tokens: drafted no more

    @property
    def host_s(self) -> float:
        """The host's time the device waited for (overlapped work excluded)."""
        return self.step_s - self.forward_s - self.overlapped_s

    def since(self, earlier: HostClock) -> HostClock:
        return HostClock(self.steps - earlier.steps, self.passes - earlier.passes,
                         self.step_s - earlier.step_s, self.forward_s - earlier.forward_s,
                         self.overlapped_s - earlier.overlapped_s, self.guesses - earlier.guesses,
                         self.guesses_taken - earlier.guesses_taken)

    def host_ms_per_pass(self) -> float:
        return 1e3 * self.host_s / self.passes if self.passes else 0.0

