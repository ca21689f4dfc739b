"""The GPU check's own logic (scripts/gpu_step.py and the stages of scripts/gpu_check.py),
on CPU: a device run is a few minutes every few sessions, so a typo in a variant's
settings or a broken stage must show here, not there. What needs CUDA (timings, graphs)
is not run. The pdl stage's tests are in test_gpu_bits.py, the smoke stage's in
test_gpu_smoke.py."""

from __future__ import annotations

import os
import sys

import pytest
import torch

from codespec.engine import Engine
from codespec.forward.cuda import WIDE, CudaForward
from codespec.forward.cuda_settings import CudaSettings
from codespec.models.tiny import tiny_model
from tests.gpu_run import tiny_run

gpu_step = pytest.importorskip("gpu_step")


def test_every_variant_is_settings_the_backend_takes():
    for label, own in gpu_step.VARIANTS.items():
        env = {**gpu_step.DEFAULTS, **own}
        settings = CudaSettings.from_env(env)  # a bad name or value fails here
        names = {name for name in env if name.startswith("CODESPEC_CUDA_")}
        assert names <= {f"CODESPEC_CUDA_{field.upper()}" for field in CudaSettings.model_fields}, label
        assert label.startswith("default") or own, label
        assert (settings.pdl == "off") == (label == "no pdl"), label  # `auto`: PDL on Hopper


def test_each_variant_but_the_default_is_in_one_family():
    for label in gpu_step.VARIANTS:
        families = [name for name, of in gpu_step.FAMILIES.items() if of(label)]
        assert len(families) == (0 if label.startswith("default") else 1), (label, families)


def test_a_winner_reruns_the_later_stages_only_where_its_rows_and_pdl_held(monkeypatch):
    env = {**gpu_step.DEFAULTS, **gpu_step.VARIANTS["fused m16 pdl/prefetch"]}
    results = {"step": {"best": "fused m16 pdl/prefetch", "best_over_default": 0.8, "best_env": env,
                        "best_rows": {"rows_differing": 0}}}
    monkeypatch.delenv(gpu_step.NO_PDL, raising=False)
    monkeypatch.delenv(gpu_step.NO_FOLD, raising=False)
    for _, flag in gpu_step.SAME_BITS.values():
        monkeypatch.delenv(flag, raising=False)
    assert gpu_step.winner_env(results) == env
    monkeypatch.setenv(gpu_step.NO_FOLD, "1")
    assert gpu_step.winner_env(results) == env  # it does not fold
    monkeypatch.setenv(gpu_step.NO_PDL, "1")
    assert gpu_step.winner_env(results) is None  # the pdl stage found a bit changed
    monkeypatch.delenv(gpu_step.NO_PDL)
    results["step"]["best_env"] = {**env, "CODESPEC_CUDA_REDUCE": "fold"}
    assert gpu_step.winner_env(results) is None  # ... by the fold
    monkeypatch.delenv(gpu_step.NO_FOLD)
    for extra, flag in gpu_step.SAME_BITS.values():
        monkeypatch.setenv(flag, "1")
        results["step"]["best_env"] = env
        assert gpu_step.winner_env(results) == env  # it does not use the setting
        results["step"]["best_env"] = {**env, **extra}
        assert gpu_step.winner_env(results) is None  # ... by the setting the pdl stage found changing a bit
        monkeypatch.delenv(flag)
    results["step"]["best_env"] = env
    results["step"]["best_over_default"] = 0.99
    assert gpu_step.winner_env(results) is None  # not 3% faster


def test_a_setting_found_changing_a_bit_is_taken_by_no_variant(monkeypatch):
    """Where the pdl stage found a SAME_BITS setting changing a bit, every variant that
    takes it is skipped, and only those."""
    for _, flag in gpu_step.SAME_BITS.values():
        monkeypatch.delenv(flag, raising=False)
    monkeypatch.delenv(gpu_step.NO_PDL, raising=False)
    monkeypatch.delenv(gpu_step.NO_FOLD, raising=False)
    grouped = gpu_step.variant_env(gpu_step.VARIANTS["fused m16 pdl/prefetch fold, fold attention, row group"])
    five = gpu_step.variant_env(gpu_step.VARIANTS["fused m16 pdl/prefetch fold, fold attention"])
    assert not gpu_step.unchecked(grouped) and not gpu_step.unchecked(five)
    monkeypatch.setenv(gpu_step.SAME_BITS["row group"][1], "1")
    assert gpu_step.unchecked(grouped) and not gpu_step.unchecked(five)


def test_a_probe_with_the_winners_settings_gets_its_backend_and_leaves_the_run_as_it_was(monkeypatch):
    """gpu_check.with_env (`plain_step`): the probe sees a backend built under the
    winner's settings; after it, the run's own backend and environment."""
    gpu_check = pytest.importorskip("gpu_check")
    monkeypatch.delenv("CODESPEC_CUDA_TILE_ROWS", raising=False)
    loaded = tiny_run(rows=16, vocab_size=16)
    own = loaded.forward
    blas = ["cublas"]  # CPU torch has no cuBLASLt to choose: the choice recorded instead
    monkeypatch.setattr(torch.backends.cuda, "preferred_blas_library",
                        lambda backend=None: blas.append(str(backend)) if backend is not None else blas[-1])
    env = {"CODESPEC_CUDA_FUSED": "1", "CODESPEC_CUDA_TILE_ROWS": "16", "TORCH_BLAS_PREFER_CUBLASLT": "1"}
    seen = gpu_check.with_env(loaded, env, lambda probed: {
        "fused": probed.forward.fused, "tile_rows": probed.forward.tile_rows, "blas": blas[-1]})
    assert seen == {"env": env, "fused": True, "tile_rows": 16, "blas": "cublaslt"}  # torch read the variable
    assert blas[-1] == "cublas"  # at start-up: the probe's choice set by hand, and undone
    import os

    assert loaded.forward is own and "CODESPEC_CUDA_TILE_ROWS" not in os.environ


def fresh_kind(command: list[str]) -> str:
    """Which exactness stage a fresh process's command is (gpu_check.exactness_stages)."""
    if "repo,agent,editor" in command:
        return "workloads"
    return "edit" if "workloads" in command else "verify" if "verify" in command else "stress"


def test_the_exactness_stages_run_the_step_winner_first_with_prompt_lookup_beside_it(monkeypatch, tmp_path):
    """The winner is what the defaults become: its edit (against transformers' prompt
    lookup), verify and stress come before the default backend's, so a run cut by the
    deadline keeps the evidence the issue's bar needs; variants only where asked for."""
    gpu_check = pytest.importorskip("gpu_check")
    monkeypatch.setattr(gpu_check, "DEADLINE_S", float("inf"))
    monkeypatch.delenv("CODESPEC_CUDA_FUSED", raising=False)
    monkeypatch.setattr(gpu_check, "subprocess_stage",
                        lambda command, env, timeout, keep=None: {"command": " ".join(command), "env": env})
    monkeypatch.setattr(gpu_check, "winner_env", lambda results: {"CODESPEC_CUDA_FUSED": "1"})
    results: dict = {}
    gpu_check.exactness_stages(results, ["edit", "verify", "stress", "workloads", "edit_eager"], tmp_path, None)
    assert list(results) == ["edit_step", "verify_step", "stress_step", "workloads_step", "edit", "verify", "stress",
                             "workloads", "edit_eager"]
    assert all(results[name]["ok"] for name in results)
    assert "--systems hf_prompt_lookup,codespec" in results["edit_step"]["command"]
    assert "--systems hf_prompt_lookup,codespec" in results["edit"]["command"]
    assert "--systems codespec " in results["edit_eager"]["command"]
    # every other bench request: repo, agent and editor, against plain decoding
    assert "workloads --workloads repo,agent,editor --systems codespec " in results["workloads"]["command"]
    assert results["workloads_step"]["env"]["CODESPEC_CUDA_FUSED"] == "1"
    assert results["stress_step"]["env"]["CODESPEC_CUDA_FUSED"] == "1"
    assert "CODESPEC_CUDA_FUSED" not in results["stress"]["env"]
    assert results["edit_eager"]["env"]["CODESPEC_CUDA_PREFILL"] == "eager"
    results.clear()
    monkeypatch.setattr(gpu_check, "winner_env", lambda results: None)
    gpu_check.exactness_stages(results, ["edit", "stress"], tmp_path, None)
    assert list(results) == ["edit", "stress"]


def test_a_fresh_process_stage_keeps_its_json_and_shows_the_benchs_checks(monkeypatch, tmp_path):
    """subprocess_stage runs the command in a child process; the bench's JSON comes back
    whole and its checks (an output differing from plain's exits 0) in the summary too,
    from this run's files alone; a failing command raises with its output's tail."""
    gpu_check = pytest.importorskip("gpu_check")
    monkeypatch.setattr(gpu_check, "DEADLINE_S", 10_000.0)
    keep = tmp_path / "bench"
    keep.mkdir()
    (keep / "stale.json").write_text('{"checks": {"from an earlier run": true}}')
    write = ("import json, sys; json.dump({'checks': {'greedy outputs identical to plain': False, 'bar': True}}, "
             "open(sys.argv[1] + '/workloads.json', 'w')); print('ran')")
    command = [sys.executable, "-c", f"import os; os.makedirs({str(keep)!r}, exist_ok=True); {write}", str(keep)]
    result = gpu_check.subprocess_stage(command, dict(os.environ), 60, keep)
    assert result["returncode"] == 0 and "ran" in result["tail"]
    assert result["checks"] == {"greedy outputs identical to plain": False, "bar": True}
    assert list(result["json"]) == ["workloads.json"]
    assert "checks" in gpu_check.brief(result) and "json" not in gpu_check.brief(result)
    with pytest.raises(RuntimeError, match="exit 3: .*no such model"):
        gpu_check.subprocess_stage([sys.executable, "-c", "import sys; print('no such model'); sys.exit(3)"],
                                   dict(os.environ), 60)


def test_the_runs_backend_takes_the_schedule_the_kernel_stage_fell_back_to(monkeypatch):
    """The backend reads CODESPEC_CUDA_ATTENTION when it is built, before the kernel stage:
    where that stage falls back to the grid, the run's backend is built again with it."""
    gpu_check = pytest.importorskip("gpu_check")
    monkeypatch.delenv("CODESPEC_CUDA_ATTENTION", raising=False)
    monkeypatch.delenv("CODESPEC_CUDA_PDL", raising=False)
    loaded = tiny_run(rows=16, vocab_size=16)
    own = loaded.forward
    gpu_check.take_settled(loaded)  # nothing fell back
    assert loaded.forward is own
    monkeypatch.setenv("CODESPEC_CUDA_ATTENTION", "grid")  # what _schedule_check sets on a fallback
    gpu_check.take_settled(loaded)
    assert loaded.forward is not own and loaded.forward.attention == "grid"


def test_the_variants_take_the_schedule_the_kernel_stage_settled_on(monkeypatch):
    """Where the worklist failed the kernel stage's check, every variant (and so the
    winner that later stages run) starts from the grid, not from DEFAULTS' worklist."""
    monkeypatch.delenv("CODESPEC_CUDA_ATTENTION", raising=False)
    assert gpu_step.variant_env({})["CODESPEC_CUDA_ATTENTION"] == "worklist"
    monkeypatch.setenv("CODESPEC_CUDA_ATTENTION", "grid")
    assert gpu_step.variant_env(gpu_step.VARIANTS["fused m16 pdl/prefetch"])["CODESPEC_CUDA_ATTENTION"] == "grid"
    assert gpu_step.variant_env({"CODESPEC_CUDA_ATTENTION": "worklist"})["CODESPEC_CUDA_ATTENTION"] == "worklist"


def test_a_steps_floor_counts_lm_head_whether_or_not_it_is_tied():
    """The bar's floor: a step reads every weight once and a row of the input embeddings;
    where lm_head is the embeddings (tied, as in Qwen2.5-0.5B's own checkpoint) it reads
    that tensor whole."""
    gpu_measure = pytest.importorskip("gpu_measure")
    for tied in (False, True):
        model = tiny_model("qwen2", vocab_size=64, seed=3, dtype=torch.float32, tie_word_embeddings=tied)
        embed = model.get_input_embeddings().weight
        head = model.get_output_embeddings().weight
        assert (embed.data_ptr() == head.data_ptr()) == tied
        layers = sum(p.numel() * 4 for p in model.model.layers.parameters()) + model.model.norm.weight.numel() * 4
        assert gpu_measure.step_bytes(model) == layers + head.numel() * 4, tied


def test_the_row_check_and_the_steps_anatomy_run_against_the_backend_as_it_is():
    """The `rows` and `anatomy` stages reach into the backend (its passes, its `_replay`):
    run on CPU, a renamed method or a changed pass fails here, not in the GPU run."""
    gpu_measure = pytest.importorskip("gpu_measure")
    loaded = tiny_run(rows=16)
    assert gpu_measure.row_checks(loaded) == {"rows_checked": 39, "rows_differing": 0}
    anatomy = gpu_measure.step_anatomy(loaded, context=20, repeat=3)
    assert set(anatomy) == {"prepare_us", "launch_us", "wait_us", "wall_us"}  # no graph on CPU
    assert "_replay" not in vars(loaded.forward)  # the probe's hook undone


def test_the_step_stage_builds_and_times_every_variant_and_leaves_the_run_as_it_was(monkeypatch):
    """scripts/gpu_step.step_probe on CPU (the kernels' references, no graphs; the floor
    and the graph's replay stubbed): every variant's backend is built and stepped, each
    family's best combined, the winner's rows checked against its steps; a variant's
    failure is its own entry (cuBLASLt: CPU torch has none); the environment restored."""
    import os

    monkeypatch.delenv("CODESPEC_CUDA_ATTENTION", raising=False)
    monkeypatch.setattr(gpu_step, "step_floor", lambda loaded: {"floor_ms": 1.0})
    monkeypatch.setattr(gpu_step, "device_ms", lambda replay: replay() or 1.0)  # timed by CUDA events: CUDA only
    monkeypatch.setattr(gpu_step, "profile_step", lambda loaded: {"profiled": True})
    loaded = tiny_run(rows=64)
    own = loaded.forward
    before = {name: os.environ.get(name) for name in gpu_step.DEFAULTS}
    result = gpu_step.step_probe(loaded, deadline_s=300, context=40)
    assert set(result["variants"]) >= set(gpu_step.VARIANTS)
    failed = {label for label, entry in result["variants"].items() if "step_ms" not in entry}
    assert failed == {"cublaslt"}, result["variants"]
    # the five-launch step with gate/up's other tiles, and with every candidate, built and run
    for label in [*gpu_step.FIVE_GATE_UP_TILES, *gpu_step.FIVE_DOWN_TILES, gpu_step.EVERY_LABEL]:
        assert "step_ms" in result[label] and result[label]["device_step_ms"] == 1.0, (label, result[label])
    assert result["best"] in result["variants"] and result["best_env"]["CODESPEC_CUDA_ATTENTION"]
    if not result["best"].startswith("default"):
        assert result["best_rows"] == {"rows_checked": 39, "rows_differing": 0}
    assert loaded.forward is own and {name: os.environ.get(name) for name in gpu_step.DEFAULTS} == before


def test_the_step_stage_s_winner_keeps_the_pass_bar(monkeypatch):
    """A variant whose step is fastest but whose 32-row pass costs more than 1.3 steps
    does not win (the issue's other bar); the fastest that keeps it does, and the fastest
    step is still named."""
    steps = {"fused m16 pdl/prefetch": (1.0, 1.6), "fused m32 pdl/prefetch fold": (1.1, 1.1)}

    def measured(loaded, env, floor_ms, context, tiles=None, reduction=None):
        label = next((k for k, own in gpu_step.VARIANTS.items() if own and gpu_step.variant_env(own) == env), None)
        step, ratio = steps.get(label, (1.4, 1.1))
        return {"step_ms": step, "pass32_ms": step * ratio, "pass32_over_step": ratio}

    monkeypatch.setattr(gpu_step, "step_floor", lambda loaded: {"floor_ms": 1.0})
    monkeypatch.setattr(gpu_step, "_measure", measured)
    monkeypatch.setattr(gpu_step, "row_checks", lambda loaded: {"rows_checked": 39, "rows_differing": 0})
    monkeypatch.setattr(gpu_step, "profile_step", lambda loaded: {"profiled": True})
    result = gpu_step.step_probe(tiny_run(rows=64), deadline_s=300, context=40)
    assert result["fastest_step"] == "fused m16 pdl/prefetch"
    assert result["best"] == "fused m32 pdl/prefetch fold" and result["best_over_default"] == round(1.1 / 1.4, 3)


def test_the_plain_stage_decodes_with_steps_queued_and_not_and_compares_them(monkeypatch):
    monkeypatch.setattr(gpu_step, "step_floor", lambda loaded: {"floor_ms": 1.0})
    loaded = tiny_run(rows=16)
    result = gpu_step.plain_probe(loaded, new_tokens=8, context=20, repeat=1)
    assert result["identical"] is True and result["chained_taken"] > 0
    assert loaded.forward.chains_steps is True  # the setting as it was


def test_the_fused_tile_sweep_runs_each_tile_and_builds_the_backend_with_the_winners(monkeypatch):
    """`fusedtiles16` (the follow-up where the fused 16-row layers win): every tile of the
    sweep runs (its reference on CPU; the timing stubbed, some tiles faster than the
    default), and the fused backend with the winners passes its row check."""
    import itertools

    gpu_probes = pytest.importorskip("gpu_probes")
    order = itertools.count()

    def timed(run, calls=20):
        run()
        return 10.0 if next(order) % 7 == 0 else 5.0

    monkeypatch.setattr(gpu_probes, "_graph_us", timed)
    loaded = tiny_run(rows=64)
    result = gpu_probes.fused_tiles_probe(loaded, budget_s=5, block_m=16, live_rows=1, pdl="prefetch")
    assert result["chosen"] and all(config["block_m"] == 16 for config in result["chosen"].values())
    assert result["backend"]["rows_checked"] == 39 and result["backend"]["rows_differing"] == 0


def test_the_check_runs_its_stages_in_the_order_that_keeps_the_bar_s_evidence(monkeypatch, tmp_path):
    """gpu_check.main with every stage stubbed: checks, the step's variants and plain
    decoding first; where the step stage found a winner, `plain_step`, then the exactness
    stages, the winner's first; the explaining probes last; the JSON written."""
    import json

    gpu_check = pytest.importorskip("gpu_check")
    ran: list[str] = []
    loaded = tiny_run(rows=16, vocab_size=16, backend="cuda", reason=None)
    winner = {**gpu_step.DEFAULTS, **gpu_step.VARIANTS["fused m16"]}

    def stub(name, value=None):
        return lambda *args, **kwargs: ran.append(name) or (value if value is not None else {})

    monkeypatch.setattr(gpu_check.torch.cuda, "get_device_name", lambda *args: "stub GPU")
    monkeypatch.setattr(gpu_check, "random_model_dir", lambda assets, where: tmp_path)
    monkeypatch.setattr(gpu_check, "load", lambda model_dir: loaded)
    monkeypatch.setattr(gpu_check, "kernel_checks", stub("kernel", {"attention_schedule": "worklist"}))
    for name in ("pdl_check", "row_checks", "cost_curve", "profile_step", "step_anatomy", "attention_probe",
                 "l2_probe", "persist_probe", "trace_probe"):
        monkeypatch.setattr(gpu_check, name, stub(name))
    monkeypatch.setattr(gpu_check, "step_probe", stub("step_probe", {
        "best": "fused m16", "best_over_default": 0.8, "best_env": winner, "best_rows": {"rows_differing": 0}}))
    monkeypatch.setattr(gpu_check, "plain_probe", stub("plain_probe", {"identical": True}))
    def fresh_process(command, env, timeout, keep=None):
        kind = fresh_kind(command)
        ran.append(kind + (" fused m16" if env.get("CODESPEC_CUDA_TILE_ROWS") == "16" else ""))
        return {}

    monkeypatch.setattr(gpu_check, "subprocess_stage", fresh_process)
    monkeypatch.setattr(sys, "argv", ["gpu_check.py", "--out", str(tmp_path / "out"), "--deadline", "600"])
    monkeypatch.setattr(gpu_check, "DEADLINE_S", gpu_check.DEADLINE_S)  # main sets it: restored after the test
    gpu_check.main()
    assert ran == ["kernel", "pdl_check", "row_checks", "cost_curve", "profile_step", "step_anatomy", "step_probe",
                   "plain_probe", "plain_probe",  # plain, then plain_step with the winner
                   "edit fused m16", "verify fused m16", "stress fused m16", "workloads fused m16",  # the winner's
                   "edit", "verify", "stress", "workloads",  # the default backend's
                   "persist_probe", "trace_probe", "attention_probe", "l2_probe"]
    written = json.loads((tmp_path / "out" / "gpu-check.json").read_text())
    assert [name for name in written if name.endswith("_step")] == ["plain_step", "edit_step", "verify_step",
                                                                     "stress_step", "workloads_step"]
    assert all(written[name]["ok"] for name in written if isinstance(written[name], dict) and "ok" in written[name])
    assert "total_s" in written


def test_the_lm_screen_stage_runs_on_request_and_lands_in_the_json(monkeypatch, tmp_path):
    """`--stages lmscreen` (scripts/gpu_lmscreen.py, its own tests in tests/kernels/):
    the loaded model handed to the probe, its result written."""
    import json

    gpu_check = pytest.importorskip("gpu_check")
    loaded = tiny_run(rows=16, vocab_size=16, backend="cuda", reason=None)
    monkeypatch.setattr(gpu_check.torch.cuda, "get_device_name", lambda *args: "stub GPU")
    monkeypatch.setattr(gpu_check, "random_model_dir", lambda assets, where: tmp_path)
    monkeypatch.setattr(gpu_check, "load", lambda model_dir: loaded)
    monkeypatch.setattr(gpu_check, "lmscreen_probe", lambda given: {"same_model": given is loaded})
    monkeypatch.setattr(sys, "argv", ["gpu_check.py", "--out", str(tmp_path / "out"), "--stages", "lmscreen"])
    monkeypatch.setattr(gpu_check, "DEADLINE_S", gpu_check.DEADLINE_S)  # main sets it: restored after the test
    gpu_check.main()
    written = json.loads((tmp_path / "out" / "gpu-check.json").read_text())
    assert written["lmscreen"]["same_model"] is True and written["lmscreen"]["ok"]


def test_plain_five_times_the_five_launch_layers_and_each_candidate_where_the_pdl_stage_kept_their_bits(
        monkeypatch, tmp_path):
    """`--stages plain_five`: the plain bar's candidates, plain decoding with
    the five-launch layers, with attention over 64-key blocks, begun before
    its wait, gate/up over every SM, and all three, lm_head's screen, alone and with
    them; each new one's tree rows
    against its decode steps first. All skipped, saying why, where the pdl stage found the
    fold changing a bit; early keys', where it found them changing one."""
    import json

    gpu_check = pytest.importorskip("gpu_check")
    loaded = tiny_run(rows=16, vocab_size=16, backend="cuda", reason=None)
    seen: list[tuple] = []
    monkeypatch.setattr(gpu_check.torch.cuda, "get_device_name", lambda *args: "stub GPU")
    monkeypatch.setattr(gpu_check, "random_model_dir", lambda assets, where: tmp_path)
    monkeypatch.setattr(gpu_check, "load", lambda model_dir: loaded)
    monkeypatch.setattr(gpu_check, "plain_probe", lambda given: seen.append(
        (given.forward.fused, given.forward.key_block, given.forward.attention, given.forward.early_keys,
         given.forward.early_rows, given.forward.narrow_tiles is not None, given.forward.tiles["gate_up"].block_n,
         given.forward.screen is not None))
        or {"identical": True})
    monkeypatch.setattr(gpu_check, "row_checks",
                        lambda given: {"rows_differing": 0, "key_block": given.forward.key_block})
    for name in ("CODESPEC_CUDA_PDL", *gpu_step.CHECK_FLAGS):
        monkeypatch.setenv(name, "")  # recorded: the stage's own settings are undone after the test
        monkeypatch.delenv(name)
    monkeypatch.setattr(gpu_check, "DEADLINE_S", gpu_check.DEADLINE_S)  # main sets it: restored after the test
    argv = ["gpu_check.py", "--out", str(tmp_path / "out"), "--stages", "plain_five"]
    monkeypatch.setattr(sys, "argv", argv)
    gpu_check.main()
    # the five-launch gate/up (128 outputs) and gate/up over every SM's 16
    assert seen == [(True, 128, "fold", False, False, False, 128, False),
                    (True, 64, "fold", False, False, False, 128, False),
                    (True, 128, "fold", True, False, False, 128, False),
                    (True, 128, "fold", False, True, False, 128, False),
                    (True, 128, "fold", False, False, True, 128, False),
                    (True, 128, "fold", False, False, False, 128, True),
                    (True, 128, "fold", False, False, False, 16, False),
                    (True, 64, "fold", True, True, False, 16, True),
                    (True, 64, "fold", True, True, False, 16, True),
                    (True, 64, "fold", True, True, True, 16, True)]
    written = json.loads((tmp_path / "out" / "gpu-check.json").read_text())
    assert written["plain_five_64"]["key_block"] == 64 and written["plain_five_64"]["identical"]
    assert written["plain_five_all"]["tiles"]["gate_up"]["block_n"] == 16 and "rows_differing" in written["plain_five_all"]
    assert written["plain_five_all_down"]["tiles"]["down"]["splits"] == 19
    assert "rows_differing" not in written["plain_five"]  # nothing new in it: plain decoding alone
    monkeypatch.setenv(gpu_step.SAME_BITS["early keys"][1], "1")  # as the pdl stage leaves it where they changed a bit
    gpu_check.main()
    assert seen[10:] == [(True, 128, "fold", False, False, False, 128, False),
                         (True, 64, "fold", False, False, False, 128, False),
                         (True, 128, "fold", False, True, False, 128, False),
                         (True, 128, "fold", False, False, True, 128, False),
                         (True, 128, "fold", False, False, False, 128, True),
                         (True, 128, "fold", False, False, False, 16, False)]
    written = json.loads((tmp_path / "out" / "gpu-check.json").read_text())
    assert all("changing a bit" in written[name]["error"] for name in ("plain_five_early", "plain_five_all",
                                                                        "plain_five_all_down", "plain_five_all_narrow"))
    monkeypatch.setenv(gpu_step.NO_FOLD, "1")  # ... where the fold failed
    gpu_check.main()
    assert seen[16:] == []
    written = json.loads((tmp_path / "out" / "gpu-check.json").read_text())
    assert all("changing a bit" in written[name]["error"] for name, _, _ in gpu_check.PLAIN_FIVE)


def test_the_gate_up_probe_runs_each_variant_and_cublas(monkeypatch):
    """scripts/gpu_gateup.py on CPU (row_linear's reference; the graphs' timing stubbed
    to one call): every variant's product runs on every layer's weights, none fails, and
    the counts a folded split takes are left zero."""
    gpu_gateup = pytest.importorskip("gpu_gateup")
    calls: list[int] = []
    monkeypatch.setattr(gpu_gateup, "_graph_us", lambda run, calls_=1, **kw: calls.append(len(run())) or 1.0)
    loaded = tiny_run(rows=64)
    result = gpu_gateup.gateup_probe(loaded)
    layers = len(loaded.forward._layers)
    for name in [*gpu_gateup.VARIANTS, "cublas one row"]:
        assert result[name] == {"cold_us": round(1.0 / layers, 2), "hot_us": round(1.0 / layers, 2)}, name
    assert calls == [layers] * (2 * len(gpu_gateup.VARIANTS) + 2) and result["counts_left_zero"]


def test_a_stage_name_the_check_does_not_know_stops_it_before_the_gpu(monkeypatch, tmp_path, capsys):
    gpu_check = pytest.importorskip("gpu_check")
    monkeypatch.setattr(gpu_check.torch.cuda, "get_device_name", lambda *args: pytest.fail("touched the GPU"))
    monkeypatch.setattr(sys, "argv", ["gpu_check.py", "--out", str(tmp_path), "--stages", "kernel,rows_rael"])
    with pytest.raises(SystemExit):
        gpu_check.main()
    assert "no stage rows_rael" in capsys.readouterr().err


def test_with_the_real_weights_carried_over_their_stages_run_on_the_default_model(monkeypatch, tmp_path):
    """`--real DIR`: the pieces joined and converted once (`real_model`), the real
    weights' rows checked, then edit, verify, stress and workloads on `default` from the run's
    cache, before the random weights' own."""
    gpu_check = pytest.importorskip("gpu_check")
    ran: list[tuple[str, str]] = []
    loaded = tiny_run(rows=16, vocab_size=16, backend="cuda", reason=None)
    monkeypatch.setattr(gpu_check.torch.cuda, "get_device_name", lambda *args: "stub GPU")
    monkeypatch.setattr(gpu_check, "random_model_dir", lambda assets, where: tmp_path / "random")
    monkeypatch.setattr(gpu_check, "load", lambda model: ran.append(("load", str(model))) or loaded)
    monkeypatch.setattr(gpu_check, "real_model", lambda pieces: ran.append(("real_model", str(pieces))) or tmp_path)
    monkeypatch.setattr(gpu_check, "row_checks", lambda loaded: ran.append(("rows", "")) or {"rows_differing": 0})

    def fresh_process(command, env, timeout, keep=None):
        kind = fresh_kind(command)
        if kind != "stress":
            assert command[command.index("--model") + 1] == env["CODESPEC_MODEL"]
        ran.append((kind, env["CODESPEC_MODEL"]))
        return {}

    monkeypatch.setattr(gpu_check, "subprocess_stage", fresh_process)
    monkeypatch.setattr(sys, "argv", ["gpu_check.py", "--out", str(tmp_path / "out"), "--deadline", "600", "--real",
                                      ".gpuw-in", "--stages",
                                      "rows_real,edit_real,verify_real,stress_real,workloads_real,edit"])
    monkeypatch.setattr(gpu_check, "DEADLINE_S", gpu_check.DEADLINE_S)
    gpu_check.main()
    random = str(tmp_path / "random")
    assert ran == [("load", random), ("real_model", ".gpuw-in"), ("load", "default"), ("rows", ""),
                   ("edit", "default"), ("verify", "default"), ("stress", "default"), ("workloads", "default"),
                   ("edit", random)]


def test_the_real_weights_need_their_pieces(tmp_path):
    gpu_check = pytest.importorskip("gpu_check")
    with pytest.raises(FileNotFoundError, match="gpu-weights.sh take"):
        gpu_check.real_model(tmp_path)


def test_every_traced_variant_builds_a_traced_backend(monkeypatch):
    """The trace stage's variants (scripts/gpu_trace.py) are fused layers the backend
    takes with tracing on; the printed summary leaves their every launch out."""
    gpu_trace = pytest.importorskip("gpu_trace")
    gpu_check = pytest.importorskip("gpu_check")
    model = tiny_model("qwen2", vocab_size=32, seed=3, dtype=torch.float32)
    for label, own in gpu_trace.TRACED.items():
        for name, value in gpu_step.variant_env(own).items():
            monkeypatch.setenv(name, value)
        forward = CudaForward(model, rows=16, trace=True)
        assert forward.fused and forward.tracer is not None, label
    stage = {"fused": {"step": {"kinds": {"qkv": {"share": 5.0}}, "launches": [{"label": "qkv.0"}]}}}
    assert gpu_check.brief(stage) == {"fused": {"step": {"kinds": {"qkv": {"share": 5.0}}}}}


def test_each_variant_starts_from_the_runs_settings_not_the_last_variants(monkeypatch):
    """The step stage puts each variant's settings into the environment to build its
    backend; the next variant still starts from the run's own (an H100 run's stage read
    them back: `default (again)` ran with the grid attention of `grid attention`)."""
    monkeypatch.delenv("CODESPEC_CUDA_ATTENTION", raising=False)
    monkeypatch.delenv("CODESPEC_CUDA_PDL", raising=False)
    measured: dict[str, dict[str, str]] = {}

    def measure(loaded, env, floor_ms, context, tiles=None, reduction=None):
        import os

        os.environ.update(env)  # as _measure does
        label = next((k for k in gpu_step.VARIANTS if k not in measured), f"after the variants {len(measured)}")
        measured[label] = dict(env)
        return {"step_ms": 1.0, "pass32_ms": 1.1, "pass32_over_step": 1.1}

    monkeypatch.setattr(gpu_step, "step_floor", lambda loaded: {"floor_ms": 1.0})
    monkeypatch.setattr(gpu_step, "_measure", measure)
    monkeypatch.setattr(gpu_step, "row_checks", lambda loaded: {"rows_checked": 39, "rows_differing": 0})
    monkeypatch.setattr(gpu_step, "profile_step", lambda loaded: {"profiled": True})
    gpu_step.step_probe(tiny_run(rows=64), deadline_s=300, context=40)
    assert measured["default (again)"] == measured["default"]
    assert measured["fused m32 pdl/prefetch fold"]["CODESPEC_CUDA_ATTENTION"] == "worklist"
    assert measured["fused"]["CODESPEC_CUDA_PDL"] == "auto"


@pytest.mark.parametrize("pass_row_group", ["0", "4"])
def test_a_pass_replay_replays_its_own_pass_in_its_own_graph(monkeypatch, pass_row_group):
    """gpu_measure.pass_replay: the step stage's `device_step_ms` replayed the
    graph with the metadata of the pass before it, a 32-row pass. A replay now carries its
    own pass's metadata (one live row for a step, 32 for the pass), in the graph that pass
    takes: the wide passes' where CODESPEC_CUDA_PASS_ROW_GROUP gives one."""
    from codespec.forward.passlayout import CONTEXT, META_FIELDS
    from codespec.policy.tree import VerifyTree

    gpu_measure = pytest.importorskip("gpu_measure")
    for name, value in (("PASS_ROW_GROUP", pass_row_group), ("FUSED", "1"), ("TILE_ROWS", "16")):
        monkeypatch.setenv(f"CODESPEC_CUDA_{name}", value)
    model = tiny_model("qwen2", vocab_size=16, seed=3, dtype=torch.float32)
    forward = CudaForward(model, rows=64)
    cache = Engine(forward, None, eos_token_ids=[], slots=1).cache
    prompt = [1 + i % 15 for i in range(20)]  # ids of the 16-token vocabulary
    cache.acquire(prompt)
    forward.prefill(cache, 0, prompt, 0)
    wide_calls = []
    replay_once = forward._replay
    monkeypatch.setattr(forward, "_replay", lambda cache, bucket, layout=None: wide_calls.append(layout == WIDE) or
                        replay_once(cache, bucket, layout))
    for tree, live in ((VerifyTree.chain(11, [13] * 31), 32), (VerifyTree.chain(11), 1)):
        replay = gpu_measure.pass_replay(forward, cache, len(prompt), tree)
        wide_calls.clear()
        replay()  # no graphs on CPU: the bucket's pass over the metadata pass_replay left
        meta = forward._buckets[cache].flat[: META_FIELDS * 64].view(META_FIELDS, 64)
        assert wide_calls == [live > 16 and pass_row_group == "4"]
        assert int((meta[CONTEXT] > 0).sum()) == live
