"""Plain steps queued one ahead on the device (forward/cuda/chained.py, the cuda backend's
`launch(..., chain_next=True)`), checked on CPU where the backend runs eagerly: the
queued step is the one the engine asks for next (then it is not run again), and
anything else drops it without a trace in what the engine computes."""

from __future__ import annotations

import pytest

from codespec.engine.engine import Engine, GenerationConfig
from codespec.engine.scheduler import Scheduler
from codespec.errors import SettingError
from codespec.forward.cuda.forward import CudaForward
from codespec.forward.cuda.settings import CudaSettings
from tests.tiny import tiny_model
from codespec.policy.proposer import PromptLookupProposer
from codespec.verify.tree import VerifyTree
from tests.test_engine_lossless import hf_greedy, prompts
from tests.test_scheduler import run_all

PLAIN = GenerationConfig(max_new_tokens=20, speculate=False)


def engine_of(model, chain: str, monkeypatch, **kwargs) -> Engine:
    monkeypatch.setenv("CODESPEC_CUDA_CHAIN", chain)
    return Engine(CudaForward(model, CudaSettings(rows=4)), None, PromptLookupProposer(min_match_tokens=1), eos_token_ids=[],
                  **kwargs)


def test_plain_decoding_takes_the_queued_steps_and_is_the_model(monkeypatch):
    model = tiny_model("qwen2", vocab_size=64, seed=5)
    engine = engine_of(model, "1", monkeypatch)
    forward = engine.forward
    for prompt in prompts(64, 3, seed=1, repeat=False):
        assert engine.generate(prompt, PLAIN).token_ids == hf_greedy(model, prompt, 20)
    # 20 tokens: the prefill's, then 19 steps, all but the first queued behind the one before;
    # none is queued after the last (the token limit): nothing was computed for nothing
    assert forward.chained_taken == 3 * 18
    assert forward.chained_dropped == 0
    off = engine_of(model, "0", monkeypatch)
    assert off.generate(prompts(64, 1, seed=1, repeat=False)[0], PLAIN).token_ids == \
        engine.generate(prompts(64, 1, seed=1, repeat=False)[0], PLAIN).token_ids
    assert off.forward.chained_taken == 0 and not off.forward.chains_steps


def test_a_batch_whose_runs_end_at_different_times(monkeypatch):
    """Plain requests of different token limits, some ending on an end token, admitted one
    prefill a step: every output equals the request decoded alone."""
    model = tiny_model("qwen2", vocab_size=16, seed=3)
    monkeypatch.setenv("CODESPEC_CUDA_CHAIN", "1")
    batch = [[1, 2, 3, 4] * 2, [6, 7, 8] * 3, [9, 1, 9, 2], [3, 3, 4] * 3, [2, 7, 1]]
    configs = [GenerationConfig(max_new_tokens=n, speculate=False) for n in (24, 9, 17, 3, 30)]
    probe = Engine(CudaForward(model, CudaSettings(rows=8)), None, eos_token_ids=[])
    end = probe.generate(batch[0], configs[0]).token_ids[6]  # the first request ends by its 7th token
    engine = Engine(CudaForward(model, CudaSettings(rows=8)), None, eos_token_ids=[end], slots=4)
    scheduler = Scheduler(engine, max_active=4, max_waiting=4)
    try:
        together = run_all(scheduler, batch, configs)
    finally:
        scheduler.close()
    taken, dropped = engine.forward.chained_taken, engine.forward.chained_dropped
    alone = [engine.generate(p, c).token_ids for p, c in zip(batch, configs)]
    assert [out.token_ids for out in together] == alone
    ended = sum(len(a) < c.max_new_tokens for a, c in zip(alone, configs))
    assert ended > 0  # an end token came
    # staggered prefills (one a step) queue nothing to drop; requests that end leave the
    # others' rows; only a step queued for requests that all stopped on an end token is lost
    assert taken > 0 and dropped <= ended


def test_speculating_runs_are_never_chained_and_stay_lossless(monkeypatch):
    model = tiny_model("qwen2", vocab_size=16, seed=3)
    engine = engine_of(model, "1", monkeypatch, max_draft_tokens=8)
    for prompt in prompts(16, 3, seed=16, repeat=True):
        plain = engine.generate(prompt, GenerationConfig(max_new_tokens=24, speculate=False)).token_ids
        taken = engine.forward.chained_taken
        assert engine.generate(prompt, GenerationConfig(max_new_tokens=24)).token_ids == plain
        assert engine.forward.chained_taken == taken  # a run that may draft is never queued for


def test_a_queued_step_not_asked_for_leaves_nothing_behind(monkeypatch):
    """The backend queues the step after a plain pass; the engine asks for another step
    instead (another token at that position): the answers are those of a backend that
    never queued anything; the step queued after that one is the next one asked for."""
    model = tiny_model("qwen2", vocab_size=32, seed=7)
    monkeypatch.setenv("CODESPEC_CUDA_CHAIN", "1")
    runs = []
    for chain in (True, False):
        forward = CudaForward(model, CudaSettings(rows=4))
        engine = Engine(forward, None, eos_token_ids=[], slots=2)
        cache = engine.cache
        prompt = list(range(1, 12))
        slot, _ = cache.acquire(prompt)
        forward.prefill(cache, slot, prompt, 0)
        start = len(prompt)
        first = forward.launch(cache, [(slot, start, VerifyTree.chain(3))], chain_next=chain)()
        # the queued step would feed first[0] at start + 1; ask for another token there
        other = (first[0] + 1) % 32
        second = forward.launch(cache, [(slot, start + 1, VerifyTree.chain(other))], chain_next=chain)()
        third = forward.choices(cache, [(slot, start + 2, VerifyTree.chain(second[0]))])  # the one queued
        runs.append((first, second, third, forward.chained_taken, forward.chained_dropped))
    assert runs[0][:3] == runs[1][:3]
    assert runs[0][3:] == (1, 1) and runs[1][3:] == (0, 0)  # (taken, dropped)


def test_the_engine_says_when_the_next_pass_is_a_plain_step(monkeypatch):
    model = tiny_model("qwen2", vocab_size=16, seed=3)
    engine = engine_of(model, "1", monkeypatch, slots=3)
    run = engine.start([1, 2, 3], GenerationConfig(max_new_tokens=3, speculate=False))
    engine.advance(run)  # the prefill
    one = [VerifyTree.chain(4)]
    assert engine._plain_next([run], one)
    engine.advance(run)
    assert not engine._plain_next([run], one)  # its last token next: nothing after it
    spec = engine.start([1, 2, 3], GenerationConfig(max_new_tokens=9))
    engine.advance(spec)
    assert not engine._plain_next([spec], one)
    sampled = engine.start([1, 2, 3], GenerationConfig(max_new_tokens=9, speculate=False, temperature=0.7))
    engine.advance(sampled)
    assert not engine._plain_next([sampled], one)


def test_a_bad_setting_is_refused(monkeypatch):
    monkeypatch.setenv("CODESPEC_CUDA_CHAIN", "sometimes")  # 0/1, true/false, yes/no, on/off are words it takes
    with pytest.raises(SettingError, match="CODESPEC_CUDA_CHAIN='sometimes'"):
        CudaForward(tiny_model("qwen2", vocab_size=16, seed=3))


def test_a_request_that_ended_leaves_the_others_rows_to_take(monkeypatch):
    """Three requests' plain step queued; the first request ends, the engine asks for the
    other two (here in the other order): the queued rows are theirs, taken, not run again."""
    model = tiny_model("qwen2", vocab_size=32, seed=7)
    monkeypatch.setenv("CODESPEC_CUDA_CHAIN", "1")
    outs = []
    for chain in (True, False):
        forward = CudaForward(model, CudaSettings(rows=4))
        cache = Engine(forward, None, eos_token_ids=[], slots=3).cache
        heads = []
        for prompt in ([*range(1, 12)], [*range(5, 14)], [3, 1, 4, 1, 5]):
            slot, _ = cache.acquire(prompt)
            forward.prefill(cache, slot, prompt, 0)
            heads.append((slot, len(prompt)))
        first = forward.launch(cache, [(s, n, VerifyTree.chain(t)) for (s, n), t in zip(heads, (7, 19, 2))],
                               chain_next=chain)()
        rest = [(s, n + 1, VerifyTree.chain(t)) for (s, n), t in zip(heads[1:], first[1:])][::-1]
        second = forward.launch(cache, rest, chain_next=chain)()
        outs.append((first, second, forward.chained_taken))
    assert outs[0][:2] == outs[1][:2] and outs[0][1][0] != outs[0][1][1]
    assert outs[0][2] == 1 and outs[1][2] == 0


def test_a_pass_s_choices_are_copied_back_when_it_is_queued_not_when_they_are_read(monkeypatch):
    """On CUDA, Collect queues the copy of a pass's choices right behind the pass: asked
    for later, the copy would sit behind the step chained after the pass (one stream runs
    in order), and reading a step's choices would wait for the next step too. Faked here:
    a CUDA tensor that logs its copy, and events that log their record and wait."""
    import torch

    from codespec.forward.cuda import chained

    log: list[str] = []

    class DeviceChoices:
        is_cuda = True

        def to(self, device, non_blocking=False):
            log.append(f"copy to {device}, non_blocking={non_blocking}")
            return torch.tensor([7, 3])

    class Event:
        def record(self):
            log.append("record")

        def synchronize(self):
            log.append("wait")

    monkeypatch.setattr(torch.cuda, "Event", Event)
    collect = chained.Collect(DeviceChoices())
    assert log == ["copy to cpu, non_blocking=True", "record"]  # at the launch, before any later step
    log.append("the next step queued")
    assert collect() == [7, 3] and collect() == [7, 3]
    assert log[-2:] == ["the next step queued", "wait"]  # one wait, on the pass's own copy
    assert chained.Collect(torch.tensor([1, 2]))() == [1, 2]  # CPU: read when asked


def test_the_choices_a_launch_hands_back_were_collected_before_the_next_step_was_queued(monkeypatch):
    """The backend's side of the test above: every Collect that `launch` returns (the
    pass's own, or the queued step's when it is taken) was made, so its copy queued,
    before that launch queued the step after it."""
    from codespec.forward.cuda import chained
    from codespec.forward.cuda import forward as cuda

    clock, made = [0], {}

    class Logged(chained.Collect):
        def __init__(self, choices):
            super().__init__(choices)
            clock[0] += 1
            made[id(self)] = clock[0]

    monkeypatch.setattr(cuda, "Collect", Logged)
    monkeypatch.setattr(chained, "Collect", Logged)
    model = tiny_model("qwen2", vocab_size=64, seed=5)
    engine = engine_of(model, "1", monkeypatch)
    forward, queued_at = engine.forward, []
    real_queue, real_launch = forward._queue_step, forward.launch

    def queue(*args):
        clock[0] += 1
        queued_at.append(clock[0])
        return real_queue(*args)

    def launch(cache, requests, chain_next=False):
        queued = len(queued_at)
        collect = real_launch(cache, requests, chain_next)
        if len(queued_at) > queued:  # this launch queued a step: its choices were collected first
            checked.append(made[id(collect)] < queued_at[-1])
        return collect

    checked: list[bool] = []
    monkeypatch.setattr(forward, "_queue_step", queue)
    monkeypatch.setattr(forward, "launch", launch)
    prompt = prompts(64, 1, seed=1, repeat=False)[0]
    assert engine.generate(prompt, PLAIN).token_ids == hf_greedy(model, prompt, 20)
    assert forward.chained_taken == 18 and len(checked) == 18 and all(checked)
