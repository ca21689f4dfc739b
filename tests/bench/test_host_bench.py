"""`codespec bench host`: the oracle forward replays a model's greedy output exactly as the
model's passes would decide it, so every policy over it commits the model's tokens, with
the same acceptance, and the suite times the engine alone."""

from __future__ import annotations

import time

import pytest

from codespec.bench.batch_bench import policies
from codespec.bench.host_bench import greedy_sequences, run_host_bench
from codespec.bench.oracle import OracleForward
from codespec.bench.request_sets import Workload
from codespec.engine.engine import Engine, GenerationConfig
from codespec.engine.kvcache import SlotCache
from codespec.errors import CodespecError
from codespec.forward.select import of_model
from codespec.index import Draft
from codespec.models.tiny import tiny_model
from codespec.policy.proposer import PromptLookupProposer
from codespec.policy.tree import VerifyTree
from tests.test_engine_lossless import prompts


def _model_engine(policy_tokens: int = 0, draft_policy: str = "chain") -> tuple[Engine, SlotCache]:
    model = tiny_model("qwen2", vocab_size=16, seed=3)
    cache = SlotCache(model.config, slots=4, slot_tokens=160, dtype=model.dtype, chunk=32)
    engine = Engine(of_model(model), None, PromptLookupProposer(min_match_tokens=1), max_draft_tokens=policy_tokens,
                    draft_policy=draft_policy, eos_token_ids=[], cache=cache)
    return engine, cache


def test_every_policy_over_the_oracle_commits_the_models_greedy_output_with_its_acceptance():
    requests = [Workload(f"r{i}", "", tuple(p), 24) for i, p in enumerate(prompts(16, 3, seed=5, repeat=True))]
    model_engine, _ = _model_engine()
    sequences, eos = greedy_sequences(model_engine, {"tiny": requests})
    proposer = PromptLookupProposer(min_match_tokens=1)
    results = run_host_bench(sequences, eos, None, {"tiny": requests}, {"tiny": proposer}, [1, 2],
                             pass_s=0.0, bucket=64, chunk=32)
    assert len(results) == 2 * len(policies())
    assert all(r.identical and r.tokens == 3 * 24 for r in results)
    drafted = {r.system: r for r in results if r.batch == 1}
    assert drafted["chain-8"].committed_in_passes > drafted["chain-8"].passes  # drafts were accepted

    # the same acceptance as the model's own passes: chain-8 over the tiny model itself
    speculating, _ = _model_engine(8)
    passes = committed = 0
    for request in requests:
        out = speculating.generate(request.prompt_ids, GenerationConfig(request.max_new_tokens))
        assert list(out.token_ids) == sequences[tuple(request.prompt_ids)][len(request.prompt_ids):]
        passes += out.stats.verify_passes
        committed += out.stats.committed_in_passes
    assert (drafted["chain-8"].passes, drafted["chain-8"].committed_in_passes) == (passes, committed)


def test_the_oracle_accepts_a_branch_only_where_it_follows_the_output():
    oracle = OracleForward({(1, 2): [1, 2, 3, 4, 5, 6]}, eos_id=0)
    oracle.prefill(None, 0, [1, 2], 0)
    # pending 3, then two branches: 9 (off the output) and 4 -> 5 (on it)
    tree = VerifyTree.build(3, Draft((9, 4, 5), (-1, -1, 1), (1, 1, 1), match_len=1, source="test"))
    picked = oracle.choices(None, [(0, 2, tree)])
    on_output = {node: tree.tokens[node] for node in range(len(tree)) if picked[node] != 0}
    assert picked[0] == 4 and sorted(on_output.values()) == [3, 4, 5]
    assert picked[tree.tokens.index(5)] == 6
    oracle.prefill(None, 1, [1, 2], 0)
    assert oracle.choices(None, [(1, 5, VerifyTree.chain(6, [7]))]) == [0, 0]  # past the end: end of sequence


def test_the_oracle_sleeps_per_bucket_and_refuses_what_it_cannot_replay():
    oracle = OracleForward({(1,): [1, 2]}, eos_id=0, pass_s=0.02, bucket=4, row_s=0.01)
    oracle.prefill(None, 0, [1], 0)
    began = time.perf_counter()
    oracle.choices(None, [(0, 1, VerifyTree.chain(2, [3, 4, 5, 6]))])  # 5 rows: two buckets, 3 more rows
    assert time.perf_counter() - began >= 0.07
    with pytest.raises(CodespecError, match="no greedy output"):
        oracle.prefill(None, 0, [7, 7], 0)
    with pytest.raises(CodespecError, match="greedy choices only"):
        oracle.tensor(oracle.logits(None, [(0, 1, VerifyTree.chain(2))]))


def test_the_oracle_queues_passes_and_plain_steps_on_a_virtual_device(monkeypatch):
    """Passes run one after another on the oracle's virtual device; a plain step queued
    behind a pass (cuda/chained.py) starts when that pass ends, whatever the host does,
    and is taken when asked for, dropped when not."""
    from codespec.bench import oracle as module

    clock = [0.0]

    def now() -> float:
        clock[0] += 1e-4  # every look at the clock takes a tenth of a millisecond
        return clock[0]

    monkeypatch.setattr(module, "time", type("Clock", (), {"perf_counter": staticmethod(now)}))
    oracle = OracleForward({(1,): [1, 2, 3, 4, 5, 6]}, eos_id=0, pass_s=0.01)
    oracle.prefill(None, 0, [1], 0)
    collect = oracle.launch(None, [(0, 1, VerifyTree.chain(2))], chain_next=True)
    ends = oracle._free_at
    assert collect() == [3]
    assert clock[0] < ends  # the host got its choices while the queued step still runs
    clock[0] += 0.05  # the host is slow: the queued step ended meanwhile, where it started
    assert oracle.launch(None, [(0, 2, VerifyTree.chain(3))], chain_next=True)() == [4]
    assert oracle.chained_taken == 1
    assert oracle.launch(None, [(0, 3, VerifyTree.chain(9))])() == [0]  # not the queued step (4 follows)
    assert oracle.chained_dropped == 1
    monkeypatch.setenv("CODESPEC_CUDA_CHAIN", "0")
    unchained = OracleForward({(1,): [1, 2, 3]}, eos_id=0)
    unchained.prefill(None, 0, [1], 0)
    unchained.launch(None, [(0, 1, VerifyTree.chain(2))], chain_next=True)()
    assert unchained._queued is None
