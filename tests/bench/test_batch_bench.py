"""`codespec bench verify`'s runner on a tiny model: every policy at each batch size,
outputs identical to speculation off, and a batch smaller than the set really caps how
many requests decode together."""

from __future__ import annotations

from codespec.bench.batch_bench import bar_checks, policies, run_verify_bench
from codespec.bench.request_sets import Workload
from codespec.engine import Engine
from codespec.engine.kvcache import SlotCache
from codespec.models.tiny import tiny_model
from codespec.policy.proposer import PromptLookupProposer
from codespec.forward import of_model
from tests.test_engine_lossless import prompts


def test_every_policy_at_every_batch_size_matches_speculation_off():
    model = tiny_model("qwen2", vocab_size=16, seed=3)
    cache = SlotCache(model.config, slots=4, slot_tokens=128, dtype=model.dtype, chunk=32)
    requests = [Workload(f"r{i}", "", tuple(p), 24) for i, p in enumerate(prompts(16, 3, seed=5, repeat=True))]
    engines: dict[str, Engine] = {}
    widest = [0]

    def engine_for(set_name, policy):
        if policy.name not in engines:
            engine = Engine(of_model(model), None, PromptLookupProposer(min_match_tokens=1), max_draft_tokens=policy.max_draft_tokens,
                            draft_policy=policy.draft_policy, eos_token_ids=[], cache=cache)
            step = engine.step

            def counting(runs, **kwargs):
                widest[0] = max(widest[0], len(runs))
                return step(runs, **kwargs)

            engine.step = counting
            engines[policy.name] = engine
        return engines[policy.name]

    results = run_verify_bench(engine_for, {"tiny": requests}, batches=[1, 2])
    assert len(results) == 2 * len(policies())
    assert all(r.identical and r.tokens == 3 * 24 for r in results)
    assert all(r.host_ms_per_pass > 0 and r.to_json()["host_ms_per_pass"] >= 0 for r in results)
    assert widest[0] == 2  # three requests, at most two decoding at once
    checks = bar_checks(results)
    assert checks["identical"] and "tiny: goodput aggregate >= none and best fixed (batch 2)" in checks
