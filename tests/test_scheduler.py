"""The scheduler on a tiny model: interleaved outputs equal sequential ones, limits hold."""

from __future__ import annotations

import threading
import time

import pytest

from codespec.engine.engine import Engine, GenerationConfig
from tests.tiny import tiny_model
from codespec.policy.proposer import PromptLookupProposer
from codespec.engine.scheduler import Scheduler, SchedulerFull
from codespec.forward.select import of_model


def run_all(scheduler, prompts, config):
    """Every prompt submitted at once, with `config` or each with its own (a list)."""
    configs = config if isinstance(config, list) else [config] * len(prompts)
    results, done = {}, threading.Event()

    def finished(i):
        def on_done(outcome):
            results[i] = outcome
            if len(results) == len(prompts):
                done.set()
        return on_done

    for i, (prompt, each) in enumerate(zip(prompts, configs)):
        scheduler.submit(prompt, each, on_tokens=lambda tokens: None, on_done=finished(i))
    assert done.wait(120)
    return [results[i] for i in range(len(prompts))]


def test_interleaved_equals_sequential_and_zero_waiting_still_serves():
    engine = Engine(of_model(tiny_model("qwen2", vocab_size=16, seed=3)), None, PromptLookupProposer(min_match_tokens=1),
                    eos_token_ids=[], slots=3)
    prompts = [[1, 2, 3, 4] * 2, [5, 6, 7] * 3, [9, 1, 9, 2]]
    config = GenerationConfig(max_new_tokens=20)
    scheduler = Scheduler(engine, max_active=3, max_waiting=0)  # no queue, but free slots serve
    try:
        outs = run_all(scheduler, prompts, config)
    finally:
        scheduler.close()
    assert [o.token_ids for o in outs] == [engine.generate(p, config).token_ids for p in prompts]


def test_full_queue_is_refused():
    engine = Engine(of_model(tiny_model("qwen2", vocab_size=16, seed=3)), None, eos_token_ids=[])
    scheduler = Scheduler(engine, max_active=1, max_waiting=0)
    scheduler.close()  # a stopped worker admits nothing: the first ticket takes the free slot's place
    scheduler.submit([1, 2], GenerationConfig(4), lambda t: None, lambda o: None)
    with pytest.raises(SchedulerFull):
        scheduler.submit([1, 2], GenerationConfig(4), lambda t: None, lambda o: None)


def tiny_engine():
    return Engine(of_model(tiny_model("qwen2", vocab_size=16, seed=3)), None, PromptLookupProposer(min_match_tokens=1),
                  eos_token_ids=[], slots=3)


def test_an_engine_factory_runs_on_the_worker_thread_and_its_failure_reaches_the_caller():
    built_on = []

    def build():
        built_on.append(threading.current_thread().name)
        return tiny_engine()

    scheduler = Scheduler(build, max_active=2)
    try:
        (out,) = run_all(scheduler, [[1, 2, 3, 1, 2]], GenerationConfig(max_new_tokens=6))
    finally:
        scheduler.close()
    assert built_on == ["codespec-scheduler"] and len(out.token_ids) == 6

    def broken():
        raise FileNotFoundError("no model at /nowhere")

    with pytest.raises(FileNotFoundError, match="/nowhere"):
        Scheduler(broken)


def test_without_a_thread_drain_runs_every_request_on_the_callers_thread():
    engine = tiny_engine()
    prompts, config = [[1, 2, 3, 4] * 2, [5, 6, 7] * 3], GenerationConfig(max_new_tokens=12)
    scheduler = Scheduler(engine, max_active=2, thread=False)
    outs, threads = {}, set()
    for i, prompt in enumerate(prompts):
        scheduler.submit(prompt, config, on_tokens=lambda t: threads.add(threading.current_thread().name),
                         on_done=lambda o, i=i: outs.__setitem__(i, o))
    scheduler.drain()
    assert threads == {threading.current_thread().name}
    assert [outs[i].token_ids for i in range(2)] == [engine.generate(p, config).token_ids for p in prompts]


def test_a_listener_that_fails_on_tokens_still_hears_the_end():
    """A front end whose on_tokens raised used to be dropped without a word: the language
    server then waited for that completion forever (a hang)."""
    scheduler = Scheduler(tiny_engine(), max_active=2)
    ended = threading.Event()
    outcome = []

    def on_tokens(tokens):
        raise RuntimeError("Already borrowed")  # what a tokenizer used from two threads raised

    def on_done(result):
        outcome.append(result)
        ended.set()

    try:
        scheduler.submit([1, 2, 3], GenerationConfig(max_new_tokens=8), on_tokens, on_done)
        assert ended.wait(60), "the failed listener never heard the end of its request"
        assert isinstance(outcome[0], RuntimeError)
        # and the worker serves on
        assert run_all(scheduler, [[4, 5, 6]], GenerationConfig(max_new_tokens=4))[0].token_ids
    finally:
        scheduler.close()


def test_a_step_that_fails_ends_its_requests_and_the_worker_serves_on():
    engine = tiny_engine()
    scheduler = Scheduler(engine, max_active=2)
    real_step, calls = engine.step, []

    def failing_once(runs, **kwargs):
        calls.append(len(runs))
        if len(calls) == 1:
            raise MemoryError("a defect outside any one run")
        return real_step(runs, **kwargs)

    engine.step = failing_once
    try:
        first = run_all(scheduler, [[1, 2, 3]], GenerationConfig(max_new_tokens=8))[0]
        assert isinstance(first, MemoryError)
        later = run_all(scheduler, [[1, 2, 3]], GenerationConfig(max_new_tokens=8))[0]
        assert later.token_ids == engine.generate([1, 2, 3], GenerationConfig(max_new_tokens=8)).token_ids
    finally:
        scheduler.close()


def test_llama_time_limit_waits_for_a_newline():
    """llama.cpp's t_max_predict_ms stops only once a newline was generated (and counts
    from the first token): a limit of zero still lets the first line through."""
    engine = tiny_engine()  # no tokenizer: its text has no newline, ever
    plain = engine.generate([1, 2, 3], GenerationConfig(max_new_tokens=12, time_limit_s=0.0))
    llama = engine.generate([1, 2, 3], GenerationConfig(max_new_tokens=12, time_limit_s=0.0, time_limit_llama=True))
    assert plain.finish_reason == "length" and len(plain.token_ids) < 12
    assert len(llama.token_ids) == 12


def test_idle_time_prefills_ahead_and_a_request_preempts_it():
    """The worker prefills prompts handed in ahead while nothing else runs; the request
    then reuses those chunks; a request that comes during such work pre-empts it."""
    engine = Engine(of_model(tiny_model("qwen2", vocab_size=16, seed=3)), None, eos_token_ids=[], slots=2)
    prompt = [1, 2, 3, 4, 5, 6, 7] * 60  # 420 tokens: one whole 256-token chunk, five 32-token sub-chunks
    config = GenerationConfig(max_new_tokens=6)
    scheduler = Scheduler(engine, max_active=2)
    try:
        scheduler.prefill_ahead("a.py", prompt)
        for _ in range(600):
            if scheduler.ahead_tokens == 416 and not scheduler._ahead:
                break
            time.sleep(0.05)
        assert scheduler.ahead_tokens == 416 and not scheduler._ahead, "the idle worker never prefilled ahead"
        out = run_all(scheduler, [prompt], config)[0]
        assert out.stats.cached_prompt_tokens == 416

        started = threading.Event()

        def stubborn(prompt_ids, preempted):  # a chunk that lasts until a request comes
            started.set()
            while not preempted():
                time.sleep(0.005)
            return 0

        engine.prefill_ahead = stubborn
        scheduler.prefill_ahead("b.py", [9] * 300)
        assert started.wait(30)
        assert [o.token_ids for o in run_all(scheduler, [[1, 2, 3]], config)] == \
            [engine.generate([1, 2, 3], config).token_ids]
        assert scheduler.ahead_preempted >= 1
    finally:
        scheduler.close()
