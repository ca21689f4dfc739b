"""The scheduler on a tiny model: interleaved outputs equal sequential ones, limits hold."""

from __future__ import annotations

import threading

import pytest

from codespec.engine import Engine, GenerationConfig
from codespec.models.tiny import tiny_model
from codespec.policy.proposer import PromptLookupProposer
from codespec.engine.scheduler import Scheduler, SchedulerFull
from codespec.forward import of_model


def run_all(scheduler, prompts, config):
    results, done = {}, threading.Event()

    def finished(i):
        def on_done(outcome):
            results[i] = outcome
            if len(results) == len(prompts):
                done.set()
        return on_done

    for i, prompt in enumerate(prompts):
        scheduler.submit(prompt, config, on_tokens=lambda tokens: None, on_done=finished(i))
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
