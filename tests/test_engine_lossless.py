"""Lossless: speculative output equals the same engine's plain output, token for token.

float64 tiny models keep logits free of near-ties. Prompts come in two kinds: random
ones (drafts rarely match) and ones built to repeat over a 16-token vocabulary, where the
models fall into loops so that drafts are accepted as well as rejected; the test asserts
that both happened, so it cannot pass by never speculating.
"""

from __future__ import annotations

import pytest
import torch

from codespec.engine.engine import Engine, GenerationConfig
from tests.tiny import tiny_model
from codespec.policy.proposer import PromptLookupProposer
from codespec.forward.select import of_model


def prompts(vocab: int, count: int, seed: int, repeat: bool) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        if repeat:
            base = torch.randint(0, vocab, (int(torch.randint(3, 9, (1,), generator=g)),), generator=g).tolist()
            out.append(base * int(torch.randint(2, 5, (1,), generator=g)))
        else:
            out.append(torch.randint(0, vocab, (int(torch.randint(1, 40, (1,), generator=g)),), generator=g).tolist())
    return out


def speculation_checked(engine, prompt_list, max_new_tokens: int) -> tuple[int, int]:
    """Asserts that each prompt's speculative output equals its plain output; returns the
    draft tokens (accepted, rejected), so a caller can assert that both happened."""
    accepted = rejected = 0
    for prompt in prompt_list:
        plain = engine.generate(prompt, GenerationConfig(max_new_tokens=max_new_tokens, speculate=False))
        spec = engine.generate(prompt, GenerationConfig(max_new_tokens=max_new_tokens))
        assert spec.token_ids == plain.token_ids, f"prompt {prompt}"
        assert plain.stats.draft_tokens == 0 and plain.stats.accepted_tokens_per_pass == 1.0
        accepted += spec.stats.accepted_draft_tokens
        rejected += spec.stats.draft_tokens - spec.stats.accepted_draft_tokens
    return accepted, rejected


def hf_greedy(model, prompt: list[int], new_tokens: int, **generate: object) -> list[int]:
    """transformers' greedy generate: exactly `new_tokens` tokens after `prompt`."""
    ids = torch.tensor([prompt])
    return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                          min_new_tokens=new_tokens, do_sample=False, pad_token_id=0,
                          **generate)[0, len(prompt):].tolist()


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("max_draft_tokens", [1, 4, 16])
def test_speculative_equals_plain(arch, max_draft_tokens):
    accepted = rejected = 0
    for vocab, repeat in ((16, True), (128, False)):
        model = tiny_model(arch, vocab_size=vocab, seed=3)
        engine = Engine(of_model(model), None, PromptLookupProposer(min_match_tokens=1), max_draft_tokens=max_draft_tokens,
                        eos_token_ids=[])
        more_accepted, more_rejected = speculation_checked(engine, prompts(vocab, 12, seed=vocab, repeat=repeat), 48)
        accepted, rejected = accepted + more_accepted, rejected + more_rejected
    assert accepted > 20 and rejected > 20, (accepted, rejected)


@pytest.mark.parametrize("kv_heads", [2, 1])
def test_plain_engine_equals_hf_greedy_generate(kv_heads):
    """The reference itself is right: plain decoding equals transformers' greedy generate,
    with lean attention calls (two query heads per KV head: the float64 probe fails) and
    with padded ones (four per KV head; rowcalls.py)."""
    model = tiny_model("qwen2", vocab_size=64, seed=5, num_key_value_heads=kv_heads)
    engine = Engine(of_model(model), None, eos_token_ids=[])
    for prompt in prompts(64, 4, seed=1, repeat=False):
        hf = hf_greedy(model, prompt, 24)
        assert engine.generate(prompt, GenerationConfig(max_new_tokens=24, speculate=False)).token_ids == hf


def test_hf_generate_on_a_model_the_engine_installed_into_keeps_its_masks():
    """The engine routes attention through its slots; forwards it does not drive (the HF
    prompt-lookup baseline of `codespec bench`) must still get correct causal masks,
    also for multi-token steps on top of a cache."""
    model = tiny_model("qwen2", vocab_size=16, seed=3)
    engine = Engine(of_model(model), None, eos_token_ids=[])
    for prompt in prompts(16, 4, seed=16, repeat=True):
        hf = hf_greedy(model, prompt, 24, prompt_lookup_num_tokens=4)
        assert engine.generate(prompt, GenerationConfig(max_new_tokens=24, speculate=False)).token_ids == hf


def test_eos_and_limit_stop_at_the_same_token_with_and_without_speculation():
    model = tiny_model("qwen2", vocab_size=16, seed=3)
    probe = Engine(of_model(model), None, PromptLookupProposer(min_match_tokens=1), eos_token_ids=[])
    prompt = [1, 2, 3, 4] * 3
    free = probe.generate(prompt, GenerationConfig(max_new_tokens=40, speculate=False)).token_ids
    eos = free[len(free) // 2]  # a token the output really produces, maybe inside a draft
    engine = Engine(of_model(model), None, PromptLookupProposer(min_match_tokens=1), eos_token_ids=[eos])
    for limit in (1, 2, 7, 40):
        a = engine.generate(prompt, GenerationConfig(max_new_tokens=limit))
        b = engine.generate(prompt, GenerationConfig(max_new_tokens=limit, speculate=False))
        assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
        assert eos not in a.token_ids and len(a.token_ids) <= limit


def test_stats_add_up():
    model = tiny_model("qwen2", vocab_size=16, seed=3)
    engine = Engine(of_model(model), None, PromptLookupProposer(min_match_tokens=1), eos_token_ids=[])
    out = engine.generate([1, 2, 3, 4] * 4, GenerationConfig(max_new_tokens=40))
    s = out.stats
    assert s.generated_tokens == len(out.token_ids) == 40
    assert s.committed_in_passes == s.generated_tokens - 1  # the first token comes from the prefill
    assert sum(s.histogram.values()) == s.verify_passes
    assert s.accepted_draft_tokens <= s.draft_tokens
    assert 0 < s.ttft_s <= s.wall_s


def test_the_clock_puts_the_forwards_time_apart_from_the_hosts():
    """Engine.clock: what the forward's calls take is forward time, the rest of a step
    host time (bench verify's host ms/pass): a forward that sleeps 20 ms per call
    puts at least that into forward_s and none of it into the host's part."""
    import time

    from codespec.engine.stats import HostClock

    model = tiny_model("qwen2", vocab_size=16, seed=3)
    forward = of_model(model)
    slow, calls = forward.choices, []

    def choices(*args):
        calls.append(time.perf_counter())
        time.sleep(0.02)
        return slow(*args)

    forward.choices = choices
    engine = Engine(forward, None, PromptLookupProposer(min_match_tokens=1), eos_token_ids=[])
    before = HostClock(**vars(engine.clock))
    out = engine.generate([1, 2, 3, 4] * 4, GenerationConfig(max_new_tokens=12))
    clock = engine.clock.since(before)
    assert clock.passes == out.stats.verify_passes == len(calls) and clock.steps == clock.passes + 1  # + the prefill
    assert clock.forward_s >= 0.02 * len(calls)
    assert 0 <= clock.host_s < clock.step_s - 0.02 * len(calls)
    assert clock.host_ms_per_pass() == 1e3 * clock.host_s / clock.passes


def test_bad_requests_fail_clearly():
    from codespec.errors import RequestError

    engine = Engine(of_model(tiny_model("llama", vocab_size=16, max_position_embeddings=32)), None, eos_token_ids=[])
    with pytest.raises(RequestError, match="empty"):
        engine.generate([], GenerationConfig())
    for bad in (16, -1):  # past the embedding table: refused before any backend gathers it
        with pytest.raises(RequestError, match=f"^token id {bad} is outside the model's vocabulary \\(ids 0 to 15\\)$"):
            engine.generate([1, bad, 2], GenerationConfig())
    with pytest.raises(RequestError, match="context holds 32"):
        engine.generate(list(range(16)) * 2, GenerationConfig())
    # a prompt that nearly fills the context still generates, up to the context's end
    assert len(engine.generate([1] * 30, GenerationConfig(max_new_tokens=10)).token_ids) == 2


def test_index_drafts_are_lossless_and_used():
    """Drafts from a SuffixIndex (static + past generations) keep the output unchanged.

    The index holds this model's own earlier outputs (drafts get accepted) and another
    model's outputs for the same prompts (drafts get rejected)."""
    from codespec.index import SuffixIndex
    from codespec.policy.proposer import IndexedProposer

    model = tiny_model("qwen2", vocab_size=128, seed=3)
    other = tiny_model("qwen2", vocab_size=128, seed=4)
    plain_engine = Engine(of_model(model), None, eos_token_ids=[])
    other_engine = Engine(of_model(other), None, eos_token_ids=[])
    cases = prompts(128, 8, seed=9, repeat=False)
    files = {}
    for i, prompt in enumerate(cases[:4]):
        files[f"own{i}.py"] = prompt + plain_engine.generate(prompt, GenerationConfig(40, speculate=False)).token_ids
    for i, prompt in enumerate(cases):
        files[f"other{i}.py"] = prompt + other_engine.generate(prompt, GenerationConfig(40, speculate=False)).token_ids
    index = SuffixIndex.build(files)
    engine = Engine(of_model(model), None, IndexedProposer(index, min_match_tokens=1), max_draft_tokens=8, eos_token_ids=[])
    accepted = rejected = 0
    for prompt in cases:
        plain = plain_engine.generate(prompt, GenerationConfig(40, speculate=False))
        spec = engine.generate(prompt, GenerationConfig(40))
        assert spec.token_ids == plain.token_ids
        accepted += spec.stats.accepted_by_source.get("static", 0)
        rejected += spec.stats.draft_tokens - spec.stats.accepted_draft_tokens
    assert accepted > 50 and rejected > 10, (accepted, rejected)
    # every finished request became a past generation in the dynamic index
    assert len(index.dynamic.keys()) == len(cases)
