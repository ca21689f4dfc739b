"""Run systems side by side on the same model and prompts; report medians and ratios.

Every system runs every workload `repeat` times, interleaved (plain, peer, codespec,
plain, ...) so that a noisy neighbour on a shared machine hits all of them alike. Each
system's speed is reported as a ratio to plain greedy decoding measured in the same run,
and each output is compared token for token with plain greedy's.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from codespec.bench.workloads import Workload
from codespec.engine import Engine, GenerationConfig

PLAIN = "plain"
HF_PROMPT_LOOKUP_TOKENS = 10  # transformers' own default for prompt_lookup_num_tokens


@dataclass(frozen=True)
class Sample:
    token_ids: tuple[int, ...]
    wall_s: float
    ttft_s: float | None = None
    accepted_tokens_per_pass: float | None = None
    verify_passes: int | None = None


@dataclass
class Result:
    workload: str
    system: str
    samples: list[Sample] = field(default_factory=list)
    ratio_vs_plain: float = 1.0
    identical: bool = True

    @property
    def wall_s(self) -> float:
        return statistics.median(s.wall_s for s in self.samples)

    @property
    def tokens(self) -> int:
        return len(self.samples[0].token_ids)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s

    def _median(self, name: str) -> float | None:
        values = [getattr(s, name) for s in self.samples if getattr(s, name) is not None]
        return statistics.median(values) if values else None

    def to_json(self) -> dict[str, Any]:
        atp = self._median("accepted_tokens_per_pass")
        ttft = self._median("ttft_s")
        return {
            "workload": self.workload,
            "system": self.system,
            "tokens": self.tokens,
            "wall_s": round(self.wall_s, 4),
            "tokens_per_s": round(self.tokens_per_s, 3),
            "ratio_vs_plain": round(self.ratio_vs_plain, 3),
            "identical_to_plain": self.identical,
            "accepted_tokens_per_pass": None if atp is None else round(atp, 3),
            "ttft_s": None if ttft is None else round(ttft, 4),
            "repeats": len(self.samples),
        }


System = Callable[[Workload], Sample]


def codespec_system(engine: Engine, speculate: bool) -> System:
    def run(workload: Workload) -> Sample:
        engine.cache.clear()  # no prompt prefix from an earlier run: peers have no such cache
        out = engine.generate(workload.prompt_ids, GenerationConfig(workload.max_new_tokens, speculate=speculate))
        s = out.stats
        return Sample(tuple(out.token_ids), s.wall_s, s.ttft_s, s.accepted_tokens_per_pass, s.verify_passes)

    return run


def hf_prompt_lookup_system(model: Any, eos_token_ids: Sequence[int]) -> System:
    """Hugging Face transformers' prompt lookup decoding (`generate`, batch 1, greedy)."""
    eos = sorted(eos_token_ids)

    @torch.inference_mode()
    def run(workload: Workload) -> Sample:
        device = next(model.parameters()).device
        ids = torch.tensor([workload.prompt_ids], device=device)
        start = time.perf_counter()
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=workload.max_new_tokens,
            do_sample=False,
            prompt_lookup_num_tokens=HF_PROMPT_LOOKUP_TOKENS,
            eos_token_id=eos,
            pad_token_id=eos[0],
        )
        wall = time.perf_counter() - start
        new = out[0, ids.shape[1] :].tolist()
        while new and new[-1] in eos:  # codespec's output excludes the EOS token
            new.pop()
        return Sample(tuple(new), wall)

    return run


def run_bench(
    workloads: Sequence[Workload],
    systems: dict[str, System],
    repeat: int,
    on_sample: Callable[[str, str, int, Sample], None] | None = None,
) -> list[Result]:
    """Measure every system on every workload; `systems` must include PLAIN."""
    assert PLAIN in systems, "ratios need plain decoding in the same run"
    results: list[Result] = []
    for workload in workloads:
        _warm_up(systems[PLAIN], workload)
        by_system = {name: Result(workload.name, name) for name in systems}
        for i in range(repeat):
            for name, system in systems.items():
                sample = system(workload)
                by_system[name].samples.append(sample)
                if on_sample:
                    on_sample(workload.name, name, i, sample)
        plain = by_system[PLAIN]
        for result in by_system.values():
            result.ratio_vs_plain = plain.wall_s / result.wall_s * result.tokens / plain.tokens
            result.identical = all(s.token_ids == plain.samples[0].token_ids for s in result.samples)
        results.extend(by_system.values())
    return results


def _warm_up(system: System, workload: Workload) -> None:
    """One short run so that first-call costs (allocator, kernel selection) stay out."""
    system(Workload(workload.name, workload.description, workload.prompt_ids, max_new_tokens=4))


def format_table(results: Sequence[Result]) -> str:
    header = f"{'workload':<9}{'system':<18}{'tokens':>7}{'wall s':>9}{'tok/s':>8}{'vs plain':>9}" \
             f"{'acc/pass':>9}{'ttft s':>8}  identical"
    lines = [header, "-" * len(header)]
    for r in results:
        j = r.to_json()
        atp = "-" if j["accepted_tokens_per_pass"] is None else f"{j['accepted_tokens_per_pass']:.2f}"
        ttft = "-" if j["ttft_s"] is None else f"{j['ttft_s']:.2f}"
        lines.append(
            f"{r.workload:<9}{r.system:<18}{r.tokens:>7}{r.wall_s:>9.2f}{r.tokens_per_s:>8.1f}"
            f"{r.ratio_vs_plain:>8.2f}x{atp:>9}{ttft:>8}  {'yes' if r.identical else 'NO'}"
        )
    return "\n".join(lines)
