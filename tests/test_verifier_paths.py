"""Every verifier path is lossless on float64 tiny models: chain, tree and goodput drafts,
row-exact attention in padded and lean calls, batched runs that join and leave, KV prefix reuse, and
their combinations. Each test also checks that the path it names really ran."""

from __future__ import annotations

import pytest
import torch

from codespec.engine.engine import Engine, GenerationConfig
from codespec.errors import CodespecError, RequestError
from codespec.engine.kvcache import SlotCache
from codespec.forward.transformers import TorchForward
from codespec.kernels import compact as compact_module
from tests.tiny import tiny_model
from codespec.verify.tree import VerifyTree
from codespec.policy.proposer import PromptLookupProposer
from tests.test_engine_lossless import prompts, speculation_checked


class Spy:
    """Counts branching trees and off-main-path acceptances (KV compactions)."""

    def __init__(self, monkeypatch):
        self.branching = self.compactions = 0
        build = VerifyTree.build.__func__
        compact = compact_module.compact_kv  # what keep_paths calls, per layer

        def counting_build(cls, pending, draft):
            tree = build(cls, pending, draft)
            self.branching += any(d != i for i, d in enumerate(tree.depths))
            return tree

        def counting_compact(*args, **kwargs):
            self.compactions += 1
            return compact(*args, **kwargs)

        monkeypatch.setattr(VerifyTree, "build", classmethod(counting_build))
        monkeypatch.setattr(compact_module, "compact_kv", counting_compact)


def engine_for(model, policy="chain", slots=2, chunk=128, max_draft_tokens=8):
    cache = SlotCache(model.config, slots=slots, slot_tokens=256, dtype=model.dtype, chunk=chunk)
    forward = TorchForward(model, padded=False if getattr(model, "lean", False) else None)
    engine = Engine(forward, None, PromptLookupProposer(min_match_tokens=1), max_draft_tokens=max_draft_tokens,
                    draft_policy=policy, eos_token_ids=[], cache=cache)
    engine.calibrate()  # as serve does at start-up: the goodput controller drafts from the first pass
    return engine


def rows_model(arch, rows, **kwargs):
    """A tiny model whose row-exact attention runs `rows` calls: "padded" (one per
    request, rowcalls.py) or "lean" (one per row). One KV head for four query heads: in
    float64 here padded calls are row-exact for that layout (not for two per KV head)."""
    model = tiny_model(arch, num_key_value_heads=1, **kwargs)
    if rows == "lean":
        model.lean = True  # engine_for: what the backend does where the probe fails
    return model


def check_rows(engine, rows):
    if rows == "padded" and not engine.verifier.padded_rows:
        pytest.skip("rowcalls.probe: padded attention calls are not row-exact on this machine")
    assert engine.verifier.padded_rows == (rows == "padded")


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("policy, rows", [("tree", "padded"), ("goodput", "padded"), ("tree", "lean"),
                                          ("goodput", "lean")])
def test_policies_and_attention_paths_equal_plain(monkeypatch, arch, policy, rows):
    spy = Spy(monkeypatch)
    model = rows_model(arch, rows, vocab_size=16, seed=3)
    engine = engine_for(model, policy)
    check_rows(engine, rows)
    accepted, rejected = speculation_checked(engine, prompts(16, 10, seed=16, repeat=True), 40)
    assert accepted > 40 and rejected > 10, (accepted, rejected)
    if policy == "tree":  # (goodput's pruning follows measured timings: not asserted on)
        assert spy.branching > 20 and spy.compactions > 20, (spy.branching, spy.compactions)


@pytest.mark.parametrize("rows", ["padded", "lean"])
def test_batched_runs_that_join_and_leave_equal_each_run_alone(monkeypatch, rows):
    """Runs of different prompt lengths and limits start at different steps, finish at
    different steps, and share every verify pass meanwhile; greedy and seeded sampled
    runs alike produce what they produce alone."""
    spy = Spy(monkeypatch)
    model = rows_model("qwen2", rows, vocab_size=16, seed=3)
    engine = engine_for(model, "tree", slots=4)
    check_rows(engine, rows)
    cases = prompts(16, 6, seed=5, repeat=True) + [[3, 1, 4, 1, 5, 9, 2, 6]]
    configs = [GenerationConfig(max_new_tokens=12 + 7 * i, temperature=1.1 if i % 3 == 2 else 0.0, seed=i)
               for i in range(len(cases))]
    alone = [engine.generate(p, c).token_ids for p, c in zip(cases, configs)]
    waiting = list(range(len(cases)))
    active, outputs, steps, widest = [], {}, 0, 0
    while waiting or active:
        if waiting and (steps % 3 == 0 or not active) and len(active) < 4:  # join every third step
            i = waiting.pop(0)
            active.append((i, engine.start(cases[i], configs[i])))
        engine.step([run for _, run in active])
        widest = max(widest, sum(run.prefilled for _, run in active))
        for i, run in [entry for entry in active if entry[1].done]:
            outputs[i] = run.result().token_ids
            active.remove((i, run))
        steps += 1
    assert [outputs[i] for i in range(len(cases))] == alone
    assert widest >= 3 and spy.branching > 0  # passes really were batched trees


def test_goodput_controller_batches_are_lossless():
    model = tiny_model("llama", vocab_size=16, seed=3)
    engine = engine_for(model, "goodput", slots=4)
    cases = prompts(16, 4, seed=7, repeat=True)
    runs = [engine.start(p, GenerationConfig(max_new_tokens=30)) for p in cases]
    while not all(run.done for run in runs):
        engine.step([run for run in runs if not run.done])
    plain = [engine.generate(p, GenerationConfig(max_new_tokens=30, speculate=False)).token_ids for p in cases]
    assert [run.result().token_ids for run in runs] == plain
    assert engine.cost.calibrated  # the controller timed verify passes
    budgets = [b for run in runs for b in run.stats.drafted_per_pass]
    assert max(budgets) > 0


@pytest.mark.parametrize("policy, rows", [("chain", "padded"), ("tree", "padded"), ("tree", "lean")])
def test_kv_prefix_reuse_is_lossless(policy, rows):
    """Requests sharing prompt prefixes reuse whole prefill chunks of earlier requests,
    and produce what a fresh engine (nothing cached) produces."""
    model = rows_model("qwen2", rows, vocab_size=64, seed=2)
    check_rows(engine_for(model), rows)
    base = prompts(64, 1, seed=3, repeat=False)[0] * 3
    cases = [base[:30], base[:30] + [5, 6], base[:45], base[:30], [9] + base[:29], base[:60]]
    engine = engine_for(model, policy, slots=2, chunk=8)
    reused = []
    for prompt in cases:
        config = GenerationConfig(max_new_tokens=16, speculate=prompt is not cases[2])
        fresh = engine_for(model, policy, slots=1, chunk=8).generate(prompt, config)
        out = engine.generate(prompt, config)
        assert out.token_ids == fresh.token_ids, f"prompt {prompt}"
        reused.append(out.stats.cached_prompt_tokens)
    assert reused[0] == 0 and reused[1] == 24 and reused[3] >= 24 and reused[4] == 0, reused


def test_kv_budget_and_slot_limits_fail_clearly():
    model = tiny_model("qwen2", vocab_size=16)
    with pytest.raises(CodespecError, match="cannot hold one slot"):
        SlotCache.within_budget(model.config, budget_mb=1, slot_tokens=1 << 20, dtype=torch.float64)
    cache = SlotCache.within_budget(model.config, budget_mb=1, slot_tokens=64, dtype=torch.float64)
    # layers, K+V, kv heads, head dim, bytes, positions (64 padded to one rowcalls.KEY_BLOCK)
    assert cache.slots == (1 << 20) // (2 * 2 * 2 * 16 * 8 * 512)
    engine = Engine(TorchForward(model), None, eos_token_ids=[], cache=cache)
    with pytest.raises(RequestError, match="KV slot: 64 tokens"):
        engine.generate(list(range(16)) * 4, GenerationConfig())
    out = engine.generate([1] * 60, GenerationConfig(max_new_tokens=20))
    assert len(out.token_ids) == 4 and out.finish_reason == "length"  # capped by the slot


def test_controller_chooses_by_goodput():
    from codespec.policy.controller import CostModel, choose, node_probabilities
    from codespec.index import Draft

    def rate(value):
        return lambda match_len, source: value

    chain = Draft.chain([1, 2, 3], counts=[9, 9, 9], match_len=3, source="context")
    flat = CostModel.of({2: 0.05, 64: 0.05})
    example = CostModel.of({2: 0.05, 3: 0.065, 4: 0.08})  # the worked example of controller.py
    assert choose([chain], [rate(0.9)], flat)[0] == chain  # free rows: take everything
    assert [len(d) for d in choose([chain, chain], [rate(0.9), rate(0.9)], flat)] == [3, 3]
    worked = lambda match_len, source: 0.9 if match_len == 3 else 1 / 3  # noqa: E731  P = 0.9, then 0.3
    assert len(choose([chain], [worked], example)[0]) == 1
    assert len(choose([chain], [rate(0.01)], flat)[0]) == 3  # free rows are worth even poor drafts
    assert len(choose([chain], [rate(0.01)], example)[0]) == 1  # the padded second row is free...
    costly = CostModel.of({2: 0.07, 3: 0.09})
    assert len(choose([chain, chain], [rate(0.01), rate(0.01)], costly)[0]) == 0  # ...else: budget 0
    tree = Draft((1, 2, 3, 4), (-1, -1, 0, 2), (6, 2, 6, 1), match_len=4, source="index")
    probs = node_probabilities(tree, rate(0.8))
    assert probs[2] < probs[0] and probs[3] < probs[2]  # never above the parent
    for cost in (flat, example, costly):
        pruned = choose([tree, chain], [rate(0.8), rate(0.5)], cost)
        for draft in pruned:
            assert draft.is_valid_tree


def test_cost_model_fits_a_line_and_follows_new_timings():
    from codespec.policy.controller import CostModel

    cost = CostModel.of({2: 0.1, 10: 0.3, 6: 0.2})
    assert cost.cost(6) == pytest.approx(0.2) and cost.cost(14) == pytest.approx(0.4)
    assert cost.cost(1) == cost.cost(2)  # one-row passes are padded to two
    for _ in range(200):
        cost.observe(10, 0.6)  # the machine got slower
    assert cost.cost(10) == pytest.approx(0.6, rel=0.05)
    assert CostModel().cost(50) == CostModel().cost(2)  # nothing measured: all passes alike


def test_cost_model_separates_row_cost_from_attended_keys():
    from codespec.policy.controller import CostModel, choose

    def truth(rows: int, keys: int) -> float:
        return 0.05 + 0.002 * rows + 1e-6 * keys

    points = {(n, n * ctx): truth(n, n * ctx) for ctx in (512, 2048) for n in (2, 8, 32)}
    cost = CostModel.of(points)
    a, b, c, d = cost.coefficients()
    assert (a, b, c, d) == pytest.approx((0.05, 0.002, 1e-6, 0.0), rel=1e-6, abs=1e-12)
    assert cost.cost(16, 16 * 1200) == pytest.approx(truth(16, 16 * 1200))
    # timed at one context only, keys cannot be told from rows: the line in rows is kept
    one_context = CostModel.of({(n, n * 512): truth(n, n * 512) for n in (2, 8, 32)})
    assert one_context.cost(8, 8 * 512) == pytest.approx(truth(8, 8 * 512))
    # negative slopes are never used: a pass never gets cheaper with more rows
    assert min(CostModel.of({(2, 9000): 0.2, (8, 100): 0.1, (32, 5000): 0.3}).coefficients()[1:]) >= 0

    # the same draft is worth drafting for a short context and not for a long one
    from codespec.index import Draft

    chain = Draft((5, 6, 7), (-1, 0, 1), (3, 3, 3), match_len=4, source="prompt")
    pricey_keys = CostModel.of({(n, n * ctx): 0.05 + 0.0005 * n + 2e-6 * n * ctx
                                for ctx in (512, 2048) for n in (2, 8, 32)})
    rates = [lambda match_len, source: 0.45] * 8
    short = choose([chain] * 8, rates, pricey_keys, contexts=[200] * 8)
    long = choose([chain] * 8, rates, pricey_keys, contexts=[8000] * 8)
    assert sum(len(d) for d in short) > sum(len(d) for d in long)


def test_cost_model_prices_each_extra_row_block():
    from codespec.policy.controller import CostModel

    def truth(rows: int) -> float:
        return 0.08 + 0.0013 * rows + 0.02 * (-(-rows // 32) - 1)

    cost = CostModel.of({n: truth(n) for n in (2, 4, 8, 16, 32, 48, 64)}, block=32)
    assert cost.coefficients()[3] == pytest.approx(0.02, rel=1e-6)
    assert cost.cost(33) - cost.cost(32) == pytest.approx(0.0213, rel=1e-6)  # the step at a block edge
    assert cost.cost(96) == pytest.approx(truth(96), rel=1e-6)


def test_acceptance_learns_by_match_length():
    from codespec.policy.controller import Acceptance, AcceptanceTable

    shared = AcceptanceTable()
    first = Acceptance(shared)
    for _ in range(30):
        first.observe(40, True)  # long matches: always accepted
        first.observe(2, False)  # short ones: never
    assert first.rate(40) > 0.9 and first.rate(2) < 0.1
    newcomer = Acceptance(shared)  # a new request starts from every request's record
    assert newcomer.rate(40) > 0.8 and newcomer.rate(2) < 0.2
    for _ in range(10):
        newcomer.observe(40, False)  # ...and then follows its own
    assert newcomer.rate(40) < 0.5 < first.rate(40)


def test_acceptance_keeps_guesses_apart_from_matches():
    from codespec.policy.controller import Acceptance, prior_rate

    record = Acceptance()
    assert record.rate(30) > record.rate(2) > record.rate(1)  # the prior trusts longer matches
    assert record.rate(30) == pytest.approx(prior_rate(9), rel=1e-9)
    for _ in range(30):
        record.observe(1, False, "anchor-guess")  # guesses that keep failing (a FIM completion)
        record.observe(1, True, "context")  # while 1-token matches hold
    assert record.rate(1, "anchor-guess") < 0.1 < 0.9 < record.rate(1, "context")


def test_prefill_ahead_computes_the_chunks_a_request_then_reuses_losslessly():
    """Background prefill (Engine.prefill_ahead): one whole chunk per call, into
    the slot a request then reuses; the request's output equals a fresh engine's."""
    model = rows_model("qwen2", "padded", vocab_size=64, seed=2)
    prompt = prompts(64, 1, seed=5, repeat=False)[0] * 3
    prompt = prompt[:45]
    config = GenerationConfig(max_new_tokens=12)
    fresh = engine_for(model, slots=1, chunk=8).generate(prompt, config)
    engine = engine_for(model, slots=2, chunk=8)
    done = []
    while (computed := engine.prefill_ahead(prompt)) is not None:
        done.append(computed)
    # whole chunks, then the last chunk's sub-chunks (one token each at chunk 8), short of the last token
    assert done == [8] * 5 + [1] * 4
    out = engine.generate(prompt, config)
    assert out.stats.cached_prompt_tokens == 44 and out.token_ids == fresh.token_ids
    longer = prompt + [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]  # 55 tokens: chunk 40-48 is whole now, not sub-chunks
    assert engine.prefill_ahead(longer) == 8 and engine.prefill_ahead(longer) == 1
    while engine.prefill_ahead(longer) is not None:
        pass
    again = engine.generate(longer, config)
    assert again.stats.cached_prompt_tokens == 54
    assert again.token_ids == engine_for(model, slots=1, chunk=8).generate(longer, config).token_ids


def test_a_preempted_chunk_is_dropped_and_changes_no_output():
    """A request that comes while a chunk is computed ahead ends that chunk between two
    layers: the slot keeps only the chunks finished before, and outputs are unchanged."""
    model = rows_model("qwen2", "padded", vocab_size=64, seed=2)
    prompt = (prompts(64, 1, seed=6, repeat=False)[0] * 3)[:30]
    config = GenerationConfig(max_new_tokens=12)
    engine = engine_for(model, slots=1, chunk=8)
    assert engine.prefill_ahead(prompt) == 8
    asked = []

    def on_second_layer():  # layer 0 writes its KV, then the request comes
        asked.append(1)
        return len(asked) >= 2

    assert engine.prefill_ahead(prompt, preempted=on_second_layer) == 0 and len(asked) == 2
    assert engine.cache.preempted is None and engine.cache.free_slots == 1
    out = engine.generate(prompt, config)
    assert out.stats.cached_prompt_tokens == 8
    assert out.token_ids == engine_for(model, slots=1, chunk=8).generate(prompt, config).token_ids


def test_prompts_ending_in_the_same_chunk_reuse_its_sub_chunks_losslessly():
    """A prompt's last, partial chunk is prefilled in sub-chunks (kvcache.spans): prompts
    that end in the same chunk (a person typing) reuse its whole sub-chunks; a prompt
    that ends in a later chunk computes that chunk whole and reuses only whole chunks.
    Every output equals a fresh engine's."""
    model = rows_model("qwen2", "padded", vocab_size=64, seed=2)
    base = [(i * 7 + 3) % 61 + 1 for i in range(60)]
    engine = engine_for(model, slots=1, chunk=16)  # sub-chunks of 2 tokens
    assert engine.cache.spans(43, 40) == [(40, 42), (42, 43)]
    cases = [base[:37], base[:41], base[:41] + [9, 9], base[:50]]
    reused = []
    for prompt in cases:
        config = GenerationConfig(max_new_tokens=12)
        fresh = engine_for(model, slots=1, chunk=16).generate(prompt, config)
        out = engine.generate(prompt, config)
        assert out.token_ids == fresh.token_ids, f"prompt {prompt}"
        reused.append(out.stats.cached_prompt_tokens)
    # nothing; two chunks and two sub-chunks; four sub-chunks; whole chunks only (it ends past the chunk)
    assert reused == [0, 36, 40, 32], reused


def test_the_cache_goes_under_the_name_the_models_forward_takes():
    """transformers 5.2x renamed `past_key_values` to `cache` (the old name warns, and goes
    in 5.40); older 5.x versions, such as the GPU machine's 5.17, know only the old one."""
    import warnings

    from codespec.forward.transformers import cache_keyword

    class Old(torch.nn.Module):
        def forward(self, input_ids=None, past_key_values=None, use_cache=None, **kwargs):
            return None

    assert cache_keyword(Old()) == "past_key_values"
    model = tiny_model("qwen2", dtype=torch.float64)
    engine = engine_for(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine.generate(prompts(64, 1, seed=5, repeat=True)[0], GenerationConfig(max_new_tokens=4))
    assert not [w for w in caught if "past_key_values" in str(w.message)]
