"""The draft model (engine/drafter.py): lossless beside every policy, its slot kept in
step with what the large model commits, and priced where it does not pay."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from codespec.engine.drafter import Drafter, tokens_to_draft, window
from codespec.engine.engine import Engine, GenerationConfig
from codespec.forward.select import of_model
from codespec.index import Draft
from codespec.policy import controller
from codespec.policy.proposer import PromptLookupProposer
from tests.test_engine_lossless import prompts
from tests.tiny import tiny_model


def engine_with(draft_model, policy: str = "chain", target=None, **drafter):
    target = target if target is not None else tiny_model("qwen2", vocab_size=128, seed=3)
    engine = Engine(of_model(target), None, PromptLookupProposer(min_match_tokens=2), max_draft_tokens=8,
                    draft_policy=policy, drafter=Drafter(of_model(draft_model), **drafter))
    engine.calibrate()  # the goodput controller prices passes from the start
    return engine


def test_the_model_drafting_for_itself_is_always_right():
    """The draft model is the large model itself: every token it drafts must be accepted,
    after any accepted length and bonus token, which holds only if its slot is cut back
    and caught up exactly with what each pass committed."""
    model = tiny_model("qwen2", vocab_size=128, seed=3)
    engine = engine_with(model, target=model)
    drafted = 0
    for prompt in prompts(128, 6, seed=5, repeat=False):
        out = engine.generate(prompt, GenerationConfig(max_new_tokens=40))
        plain = engine.generate(prompt, GenerationConfig(max_new_tokens=40, speculate=False))
        assert out.token_ids == plain.token_ids
        stats = out.stats
        assert stats.accepted_by_source["model"] == stats.drafted_by_source["model"]
        drafted += stats.drafted_by_source["model"]
    assert drafted > 100
    assert engine.drafter.cache.free_slots == engine.drafter.cache.slots  # every run gave its slot back


@pytest.mark.parametrize("policy", ["chain", "tree", "goodput"])
def test_another_model_drafting_is_lossless(policy):
    engine = engine_with(tiny_model("qwen2", vocab_size=128, seed=4), policy)
    accepted = rejected = 0
    for repeat in (False, True):
        for prompt in prompts(128, 5, seed=7, repeat=repeat):
            plain = engine.generate(prompt, GenerationConfig(max_new_tokens=32, speculate=False))
            out = engine.generate(prompt, GenerationConfig(max_new_tokens=32))
            assert out.token_ids == plain.token_ids, prompt
            accepted += out.stats.accepted_by_source["model"]
            rejected += out.stats.drafted_by_source["model"] - out.stats.accepted_by_source["model"]
    if policy != "goodput":  # a random draft model is right too rarely for the controller to keep it
        assert rejected > 0


def test_a_sampled_run_drafts_from_the_model_too():
    model = tiny_model("qwen2", vocab_size=128, seed=3)
    engine = engine_with(model, target=model)
    config = GenerationConfig(max_new_tokens=24, temperature=0.8, seed=11)
    out = engine.generate([5, 9, 2, 77, 3], config)
    assert len(out.token_ids) == 24 and out.stats.drafted_by_source["model"] > 0


def test_the_window_is_what_a_later_prompt_reuses():
    """Typing at the prompt's end keeps the draft model's window start on its grid: the
    next request reuses the window's KV, until the start moves a grid step."""
    model = tiny_model("qwen2", vocab_size=128, seed=3)
    engine = engine_with(model, target=model, window_tokens=16)
    prompt = list(range(1, 60))
    engine.generate(prompt, GenerationConfig(max_new_tokens=8))
    drafter = engine.drafter
    assert drafter.cache.reusable(window(prompt + [61], 16)) == len(window(prompt, 16))  # one more token typed
    assert drafter.cache.reusable(window(prompt + [61] * 4, 16)) == 0  # four more: the window moved


def run_of(budget: int, started: bool = False, rest: int = 100, rate: float = 0.8, passes: int = 8,
           committed: int = 10) -> SimpleNamespace:
    acceptance = SimpleNamespace(rate=lambda match_len, source="": rate)
    return SimpleNamespace(draft_budget=lambda: budget, plain=False, acceptance=acceptance,
                           stop=SimpleNamespace(max_new_tokens=rest), generated=[], started=started,
                           stats=SimpleNamespace(verify_passes=passes, committed_in_passes=committed))


class FakeDrafter:
    def __init__(self, step_s: float, started: bool = True, start_s: float = 0.0) -> None:
        self.step_s, self._started, self.start_s = step_s, started, start_s

    def started(self, run) -> bool:
        return self._started

    def fits(self, run, tokens: int) -> bool:
        return True

    def start_cost(self, run) -> float:
        return self.start_s


COST = controller.CostModel.of({2: 0.100, 4: 0.105, 8: 0.141, 16: 0.246})  # the 1.5B's passes on a Zen 4


def test_the_controller_drafts_from_the_model_where_its_steps_pay():
    nothing = controller.Offered([])
    drafted = tokens_to_draft(run_of(8), nothing, COST, FakeDrafter(0.035), 500)
    assert drafted >= 1  # the 0.5B's step beside the 1.5B's pass
    assert tokens_to_draft(run_of(8), nothing, COST, FakeDrafter(0.005), 500) > drafted  # a cheaper step: more
    assert tokens_to_draft(run_of(8, rate=0.95), nothing, COST, FakeDrafter(0.035), 500) > drafted  # likelier: more
    assert tokens_to_draft(run_of(8), nothing, COST, FakeDrafter(0.2), 500) == 0  # a step dearer than a pass
    assert tokens_to_draft(run_of(8, rate=0.1), nothing, COST, FakeDrafter(0.035), 500) == 0  # rarely right
    long_copy = controller.Offered([Draft.chain(range(8), [1] * 8, match_len=40, source="index")])
    assert tokens_to_draft(run_of(8), long_copy, COST, FakeDrafter(0.035), 500) == 0  # a copy beats it


def test_a_first_draft_weighs_the_prefill_against_the_output_to_come():
    nothing = controller.Offered([])
    assert tokens_to_draft(run_of(8, rest=100), nothing, COST, FakeDrafter(0.035, False, 0.7), 500) > 0
    assert tokens_to_draft(run_of(8, rest=10), nothing, COST, FakeDrafter(0.035, False, 0.7), 500) == 0
    # not before the other sources failed: too few passes, or passes that copied well
    assert tokens_to_draft(run_of(8, passes=2, committed=2), nothing, COST, FakeDrafter(0.035, False, 0.7), 500) == 0
    assert tokens_to_draft(run_of(8, committed=40), nothing, COST, FakeDrafter(0.035, False, 0.7), 500) == 0


def test_fixed_policies_draft_from_the_model_only_where_nothing_matched():
    drafter = FakeDrafter(1.0)
    assert tokens_to_draft(run_of(8), Draft.empty(), COST, drafter, 10) == 4
    assert tokens_to_draft(run_of(8), Draft.chain([1], [1], 2, "context"), COST, drafter, 10) == 0
    assert tokens_to_draft(run_of(2), Draft.empty(), COST, drafter, 10) == 2
