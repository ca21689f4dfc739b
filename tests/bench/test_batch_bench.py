"""`codespec bench verify`'s runner on a tiny model: every policy at each batch size,
outputs identical to speculation off, and a batch smaller than the set really caps how
many requests decode together."""

from __future__ import annotations

from codespec.bench.batch_bench import bar_checks, policies, run_verify_bench
from codespec.bench.request_sets import Workload
from codespec.engine.engine import Engine
from codespec.engine.kvcache import SlotCache
from tests.tiny import tiny_model
from codespec.policy.proposer import PromptLookupProposer
from codespec.forward.select import of_model
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


def test_the_tree_bar_is_repository_fims():
    """Trees against chain-16 is the bar on repository FIM; an edit's copy is one
    chain (a 16-node tree spreads over branches it does not need): no check there."""
    from codespec.bench.batch_bench import BatchResult

    def result(request_set: str, system: str, committed: int) -> BatchResult:
        return BatchResult(request_set, 1, system, [(1,)], 1.0, [1.0], [0.1], passes=10,
                           committed_in_passes=committed, draft_tokens=20)

    checks = bar_checks([result(s, system, committed) for s in ("edit", "fim-repo")
                         for system, committed in (("tree", 19), ("chain-16", 18))])
    assert checks["fim-repo: tree accepted/pass > chain-16 (batch 1)"] is True
    assert not any(name.startswith("edit: tree") for name in checks)
