"""Drafting ahead while a pass computes (engine/ahead.py): lossless, taken where the pass
commits the guess, a session put back exactly, and a failed guess never fails a request."""

from __future__ import annotations

import pytest

from codespec.engine.engine import Engine, GenerationConfig
from codespec.engine import ahead
from codespec.engine.scheduler import Scheduler
from codespec.forward.select import of_model
from codespec.forward.cuda.forward import CudaForward
from codespec.forward.cuda.settings import CudaSettings
from tests.tiny import tiny_model
from codespec.policy.proposer import PromptLookupProposer
from tests.test_engine_lossless import prompts


def _engine(look_ahead: bool, forward=None) -> Engine:
    model = tiny_model("qwen2", vocab_size=16, seed=3)
    forward = forward or CudaForward(model, CudaSettings(rows=16))  # on CPU: eager, its `launch` computes at once
    engine = Engine(forward, None, PromptLookupProposer(min_match_tokens=1), max_draft_tokens=8,
                    draft_policy="goodput", eos_token_ids=[], look_ahead=look_ahead, slots=4)
    engine.calibrate()
    return engine


def _run_batch(engine: Engine, prompt_list, new_tokens: int, speculate: bool = True) -> list[list[int]]:
    scheduler = Scheduler(engine, max_active=4, max_waiting=len(prompt_list), thread=False)
    outs: dict[int, list[int]] = {}
    for i, prompt in enumerate(prompt_list):
        scheduler.submit(prompt, GenerationConfig(new_tokens, speculate=speculate), on_tokens=lambda tokens: None,
                         on_done=lambda out, i=i: outs.__setitem__(i, out))
    scheduler.drain()
    for out in outs.values():
        if isinstance(out, BaseException):
            raise out
    return [list(outs[i].token_ids) for i in range(len(prompt_list))]


def test_drafting_ahead_is_lossless_and_taken_where_the_pass_commits_the_guess():
    prompt_list = prompts(16, 6, seed=11, repeat=True)
    engine = _engine(look_ahead=True)
    plain = _run_batch(engine, prompt_list, 32, speculate=False)
    before = engine.clock.guesses
    assert _run_batch(engine, prompt_list, 32) == plain
    assert engine.clock.guesses > before and engine.clock.guesses_taken > 0
    assert engine.clock.overlapped_s > 0
    # alone too, and with it off: the same outputs
    off = _engine(look_ahead=False)
    assert _run_batch(off, prompt_list, 32) == plain and off.clock.guesses == 0


def test_a_backend_without_launch_does_not_look_ahead():
    model = tiny_model("qwen2", vocab_size=16, seed=3)
    assert not Engine(of_model(model), None, eos_token_ids=[]).look_ahead  # the CPU backends compute in their call
    assert Engine(CudaForward(model, CudaSettings(rows=8)), None, eos_token_ids=[]).look_ahead


def test_a_guess_leaves_the_session_as_it_was():
    from codespec.verify.tree import VerifyTree

    engine = _engine(look_ahead=True)
    prompt = prompts(16, 1, seed=4, repeat=True)[0]
    run = engine.start(prompt, GenerationConfig(40))
    made = 0
    try:
        while not run.done:
            engine.advance(run)
            if run.done:
                break
            session = run.session
            before = session.state()
            draft_before = session.draft(6, tree=True)
            session.set_state(before)
            tree = VerifyTree.build(run.generated[-1], draft_before)
            guessed = ahead.guess(run, tree, 8)
            assert session.state()[0] == before[0] and session.state()[2:] == before[2:]
            assert session.draft(6, tree=True) == draft_before  # the same context, the same draft
            session.set_state(before)
            if guessed is not None:
                made += 1
                assert guessed.tokens[:-1] == ahead.main_chain(tree) and guessed.budget <= 8
    finally:
        run.close()
    assert made > 0


def test_a_failing_guess_fails_no_request(monkeypatch):
    prompt_list = prompts(16, 4, seed=12, repeat=True)
    engine = _engine(look_ahead=True)
    plain = _run_batch(engine, prompt_list, 24, speculate=False)

    def broken(*args, **kwargs):
        raise RuntimeError("a bug in drafting ahead")

    monkeypatch.setattr(ahead, "guess", broken)
    assert _run_batch(engine, prompt_list, 24) == plain
    assert engine.clock.guesses == 0


@pytest.mark.parametrize("rows", [4])
def test_a_pass_longer_than_the_bucket_still_looks_ahead_losslessly(rows):
    model = tiny_model("qwen2", vocab_size=16, seed=3)
    engine = _engine(look_ahead=True, forward=CudaForward(model, CudaSettings(rows=rows)))  # passes of several replays
    prompt_list = prompts(16, 4, seed=13, repeat=True)
    assert _run_batch(engine, prompt_list, 24) == _run_batch(engine, prompt_list, 24, speculate=False)
