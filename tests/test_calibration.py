"""The machine profile (forward/profile.py): stored once per machine and setting, read by
every later engine; a request never waits for probes or calibration passes."""

from __future__ import annotations

import json

import pytest

from codespec.forward import rowplan
from codespec.forward import profile as calibration
from codespec.forward import rowblocks, rowcalls
from codespec.policy import controller
from codespec.engine.engine import Engine, GenerationConfig
from codespec.engine import engine as engine_module
from codespec.engine.kvcache import SlotCache
from tests.tiny import tiny_model
from codespec.policy.proposer import PromptLookupProposer
from codespec.forward.select import of_model
from tests.test_engine_lossless import prompts

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6] * 4  # repeats: the prompt lookup drafts from the start


@pytest.fixture(autouse=True)
def any_share_is_quiet(monkeypatch):
    """These tests store timings whatever else runs on the machine (CI installs vLLM
    beside the tests): the busy check has its own tests below."""
    monkeypatch.setattr(engine_module, "QUIET_SHARE", 0.0)


def engine_on(model, cache_dir, policy="goodput"):
    cache = SlotCache(model.config, slots=2, slot_tokens=256, dtype=model.dtype, chunk=128)
    return Engine(of_model(model), None, PromptLookupProposer(min_match_tokens=1), max_draft_tokens=8, draft_policy=policy,
                  eos_token_ids=[], cache=cache, profile_dir=cache_dir)


class PassCounter:
    """Counts every verify pass the engine's verifier runs, and every calibration."""

    def __init__(self, monkeypatch, engine):
        self.passes = self.calibrations = 0
        verify = engine.verifier.verify

        def counted(items, during=None, **kwargs):
            self.passes += 1
            return verify(items, during, **kwargs)

        monkeypatch.setattr(engine.verifier, "verify", counted)
        measure = controller.CostModel.measure

        def calibrating(cost, *args, **kwargs):
            self.calibrations += 1
            return measure(cost, *args, **kwargs)

        monkeypatch.setattr(controller.CostModel, "measure", calibrating)


@pytest.mark.parametrize("stored", [False, True])
def test_first_request_of_a_fresh_engine_runs_no_calibration_pass(monkeypatch, tmp_path, stored):
    """Without a profile the controller starts from its prior; with one, from the stored
    timings. Either way every verify pass the request pays for is one of its own."""
    if stored:
        engine_on(tiny_model("qwen2", vocab_size=16, seed=3), tmp_path).calibrate()
    engine = engine_on(tiny_model("qwen2", vocab_size=16, seed=3), tmp_path)
    assert engine.cost.calibrated == stored
    counter = PassCounter(monkeypatch, engine)
    out = engine.generate(PROMPT, GenerationConfig(max_new_tokens=40))
    assert counter.calibrations == 0
    assert counter.passes == out.stats.verify_passes > 0
    assert out.stats.accepted_draft_tokens > 0  # it did speculate


def test_profile_is_stored_and_spares_the_next_engine_its_probes(monkeypatch, tmp_path):
    first = engine_on(tiny_model("llama", vocab_size=16, seed=3), tmp_path)
    stored = calibration.load(tmp_path, first.profile_key)
    assert stored is not None and stored.timings == []  # the probes, for the next process
    assert (stored.row_block, stored.padded_rows) == (first.verifier.row_block, first.verifier.padded_rows)
    first.calibrate()
    timed = calibration.load(tmp_path, first.profile_key)
    assert timed is not None and len(timed.timings) >= 4 and first.profile_path.is_file()

    def no_probe(*args, **kwargs):
        raise AssertionError("probed although a profile was stored")

    monkeypatch.setattr(rowblocks, "probe", no_probe)
    monkeypatch.setattr(rowcalls, "probe", no_probe)
    second = engine_on(tiny_model("llama", vocab_size=16, seed=3), tmp_path)
    assert second.cost.calibrated and second.cost.coefficients() == first_fit(timed)
    assert second.verifier.row_block == first.verifier.row_block
    second.calibrate()  # a no-op: nothing is timed again
    assert calibration.load(tmp_path, first.profile_key).created == timed.created


def first_fit(profile):
    cost = controller.CostModel(block=profile.row_block,
                                key_span=rowplan.padded_length if profile.padded_rows else None)
    cost.calibrated_with(profile.timings)
    return cost.coefficients()


def test_speculation_from_a_stored_profile_equals_plain(tmp_path):
    engine_on(tiny_model("qwen2", vocab_size=16, seed=3), tmp_path).calibrate()
    engine = engine_on(tiny_model("qwen2", vocab_size=16, seed=3), tmp_path)
    assert engine.cost.calibrated
    for prompt in prompts(16, 6, seed=11, repeat=True):
        plain = engine.generate(prompt, GenerationConfig(max_new_tokens=32, speculate=False))
        assert engine.generate(prompt, GenerationConfig(max_new_tokens=32)).token_ids == plain.token_ids


def test_a_corrupt_or_stale_profile_is_ignored_and_rebuilt(tmp_path, caplog):
    model = tiny_model("qwen2", vocab_size=16, seed=3)
    engine = engine_on(model, tmp_path)
    path = engine.profile_path
    path.write_text("{ not json")
    with caplog.at_level("WARNING", logger="codespec.forward.profile"):
        assert calibration.load(tmp_path, engine.profile_key) is None
    assert "ignoring the machine profile" in caplog.text
    rebuilt = engine_on(model, tmp_path)  # probes again (the model's own result) and stores it
    assert calibration.load(tmp_path, rebuilt.profile_key) is not None

    data = json.loads(path.read_text())
    data["key"]["threads"] = "999"  # measured under another setting: never reused
    path.write_text(json.dumps(data))
    assert calibration.load(tmp_path, engine.profile_key) is None
    data["key"] = engine.profile_key
    data["timings"] = [[2, 100, -1.0]]  # a timing no machine measured
    path.write_text(json.dumps(data))
    assert calibration.load(tmp_path, engine.profile_key) is None
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary files left


def test_key_names_what_changes_kernels(tmp_path):
    model = tiny_model("qwen2", vocab_size=16, seed=3)
    key = engine_on(model, tmp_path).profile_key
    for field in ("processor", "torch", "transformers", "model_shapes", "dtype", "device", "threads", "layout"):
        assert key[field], field
    wider = engine_on(tiny_model("qwen2", vocab_size=32, seed=3), tmp_path).profile_key
    assert wider["model_shapes"] != key["model_shapes"]
    assert calibration.profile_path(tmp_path, wider) != calibration.profile_path(tmp_path, key)


def test_an_unwritable_cache_costs_nothing_but_the_profile(tmp_path, caplog):
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    with caplog.at_level("WARNING", logger="codespec.forward.profile"):
        engine = engine_on(tiny_model("qwen2", vocab_size=16, seed=3), blocked)
    assert "could not store the machine profile" in caplog.text
    assert engine.generate(PROMPT, GenerationConfig(max_new_tokens=8)).stats.generated_tokens == 8


def test_uncalibrated_controller_drafts_k_for_k_until_its_online_fit_is_ready():
    """The prior: chain drafts (k tokens for a k-token match). The controller takes over
    once passes of varied sizes taught the cost model a fixed and a per-row cost."""
    engine = engine_on(tiny_model("qwen2", vocab_size=16, seed=3), None)
    assert not engine.cost.ready and not engine.cost.calibrated
    run = engine.start(PROMPT, GenerationConfig(max_new_tokens=60))
    engine.advance(run)  # prefill
    draft = engine._draft(run)
    chain = run.session.draft(run.draft_budget())
    assert draft.token_ids == chain.token_ids and len(draft) <= draft.match_len
    cost = controller.CostModel()
    for rows in (2, 3, 5, 9, 12, 2, 4, 8):
        cost.observe(rows, 0.01 + 0.001 * rows)
    assert cost.ready and not cost.calibrated
    few = controller.CostModel()
    for _ in range(20):
        few.observe(17, 0.03)  # one size only: fixed and per-row cost cannot be told apart
    assert not few.ready
    run.close()


def test_the_cpu_is_named_by_its_kind_not_its_architecture(tmp_path, monkeypatch):
    """A VM may call a Zen 5 "AMD EPYC"; the family and model numbers and the flags that
    change kernel choices (AMX, AVX-512 BF16) say which kind of x86 it is, in the profile
    key and in every benchmark's JSON."""
    from codespec.cli import bench

    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 143\n"
                    "model name\t: Intel(R) Xeon(R) Platinum 8480+\nflags\t\t: fpu avx2 fma avx512f avx512_bf16 "
                    "amx_bf16 amx_tile\n\nprocessor\t: 1\ncpu family\t: 7\nmodel name\t: other\n")
    cpu = calibration.cpu_description(str(info))
    assert (cpu.name, cpu.generation) == ("Intel(R) Xeon(R) Platinum 8480+", "family 6 model 143")
    assert {"amx_tile", "avx512_bf16"} <= cpu.flags and "other" not in cpu.name
    monkeypatch.setattr(bench, "cpu_description", lambda: cpu)
    machine = bench._machine()
    assert machine["cpu_generation"] == "family 6 model 143"
    assert machine["cpu_features"] == ["amx_tile", "amx_bf16", "avx512_bf16", "avx512f", "avx2", "fma"]
    assert bench._cpu_label(machine) == "Intel(R) Xeon(R) Platinum 8480+ (family 6 model 143)"
    missing = calibration.cpu_description(str(tmp_path / "absent"))
    assert missing.name and missing.generation == "" and not missing.flags


def test_a_benchs_json_names_the_backend_and_its_kernel_layout(monkeypatch):
    """A GPU run's figures say which CODESPEC_CUDA_* layout made them (the GPU check runs
    the same bench under several)."""
    from types import SimpleNamespace

    from codespec.cli import bench
    from codespec.forward.cuda.forward import CudaForward

    monkeypatch.setenv("CODESPEC_CUDA_ROWS", "32")
    model = tiny_model("qwen2", vocab_size=16, seed=3)
    loaded = SimpleNamespace(backend="cuda", reason=None, forward=CudaForward(model))
    record = bench._backend(loaded)
    assert record["name"] == "cuda" and "rows=32" in record["layout"] and "pdl=False" in record["layout"]


def test_timings_taken_while_the_machine_was_busy_steer_this_engine_and_are_not_stored(monkeypatch, tmp_path,
                                                                                        caplog):
    """A profile timed while other processes held the cores priced every later process's
    passes 3x too high (158.7 ms a pass where 43 was right). Such timings
    calibrate this engine alone; the profile keeps its probes, and the next start times
    the passes again."""
    monkeypatch.setattr(engine_module, "QUIET_SHARE", 0.8)
    monkeypatch.setattr(engine_module, "busy_share", lambda key, wall, cpu: 0.5)
    first = engine_on(tiny_model("qwen2", vocab_size=16, seed=3), tmp_path)
    with caplog.at_level("WARNING"):
        first.calibrate()
    assert first.cost.calibrated and first.calibration_share == 0.5
    assert "busy" in caplog.text
    stored = calibration.load(tmp_path, first.profile_key)
    assert stored is not None and stored.timings == [] and stored.row_block == first.verifier.row_block
    second = engine_on(tiny_model("qwen2", vocab_size=16, seed=3), tmp_path)
    assert not second.cost.calibrated
    monkeypatch.setattr(engine_module, "busy_share", lambda key, wall, cpu: 0.97)
    counter = PassCounter(monkeypatch, second)
    second.calibrate()  # quiet now: timed again, and stored
    stored = calibration.load(tmp_path, second.profile_key)
    assert counter.calibrations == 1 and len(stored.timings) >= 4 and stored.share == 0.97


def test_a_profile_of_the_format_before_the_busy_check_is_timed_again(tmp_path, caplog):
    """Format 1 stored timings without knowing whether the machine was busy: such a file
    is ignored once (with a warning) and the engine starts as on a new machine."""
    first = engine_on(tiny_model("qwen2", vocab_size=16, seed=3), tmp_path)
    first.calibrate()
    path = calibration.profile_path(tmp_path, first.profile_key)
    old = json.loads(path.read_text())
    old["format"] = 1
    del old["share"]
    path.write_text(json.dumps(old))
    with caplog.at_level("WARNING"):
        second = engine_on(tiny_model("qwen2", vocab_size=16, seed=3), tmp_path)
    assert not second.cost.calibrated and "format 1" in caplog.text


def test_the_busy_share_is_the_passes_thread_s_cpu_time_over_their_wall_time():
    key = {"device": "cpu", "threads": "2"}
    assert engine_module.busy_share(key, wall=1.0, cpu=0.99) == pytest.approx(0.99)
    assert engine_module.busy_share(key, wall=4.0, cpu=2.0) == pytest.approx(0.5)  # two hogs beside it
    assert engine_module.busy_share({"device": "cuda:0", "threads": "2"}, 1.0, 0.1) is None  # a GPU's passes
    assert engine_module.busy_share(None, 1.0, 1.0) is None
    assert engine_module.busy_share(key, 0.0, 0.0) is None


def test_a_busy_thread_of_this_very_process_counts_as_a_busy_machine(tmp_path):
    """The signal is the passes' own thread, not the process: threads of this process
    busy beside them (an index build, say) hold the cores as other processes would."""
    import hashlib
    import os
    import threading

    engine = engine_on(tiny_model("qwen2", vocab_size=16, seed=3), tmp_path)
    stop = threading.Event()
    block = os.urandom(1 << 20)

    def spin() -> None:
        while not stop.is_set():
            hashlib.sha256(block).digest()  # in C without the GIL: a core taken, the interpreter free

    spinners = [threading.Thread(target=spin, daemon=True) for _ in range(2 * (os.cpu_count() or 1))]
    for spinner in spinners:
        spinner.start()
    try:
        engine.calibrate()
    finally:
        stop.set()
        for spinner in spinners:
            spinner.join()
    assert engine.calibration_share is not None and engine.calibration_share < 0.8


def test_a_real_calibration_measures_the_share(tmp_path):
    """The share as calibrate measures it (1.00 on a quiet 2-core VM, 0.50 beside two
    busy processes): here only measured and in range, the machine may be busy."""
    engine = engine_on(tiny_model("qwen2", vocab_size=16, seed=3), tmp_path)
    engine.calibrate()
    assert engine.calibration_share is not None and 0.0 < engine.calibration_share <= 1.05
