"""The smoke stage (scripts/gpu_check.py's smoke_stage, scripts/gpu_smoke.py's parts) on
CPU: each part's process answered by hand, and what a failing part turns off for the
whole run: the fused layers, the plain bar's candidates, lm_head's screen, attention's
rows in groups."""

from __future__ import annotations

import sys

import pytest

from tests.gpu_run import tiny_run

gpu_step = pytest.importorskip("gpu_step")
gpu_bits = pytest.importorskip("gpu_bits")


def test_the_smoke_stage_turns_off_what_failed_to_run_for_the_whole_run(monkeypatch, tmp_path):
    """`smoke`: each untried part in a fresh process; a part that fails, or
    dies without its JSON line (a device fault), is off for the rest of the run: the fused
    layers (NO_FUSED: no fused variant, no fused pdl check, and PDL still judged on the
    default layers alone; the candidates not tried), or the plain bar's candidates
    (NO_CANDIDATES: early keys and the fused products' other tiles)."""
    import os
    import subprocess

    gpu_check = pytest.importorskip("gpu_check")
    for name in ("CODESPEC_CUDA_PDL", *gpu_step.CHECK_FLAGS):
        monkeypatch.setenv(name, "")  # recorded: the stage's own settings are undone after the test
        monkeypatch.delenv(name)
    answers = {"fused": (-11, "Fatal Python error: Segmentation fault\n"),
               "candidates": (0, '{"ok": true, "screen": {"ok": true}, "attention_rows": {"ok": true}}\n')}
    ran: list[list[str]] = []

    def run(command, **kwargs):
        ran.append(command)
        code, out = answers[command[2]]
        return subprocess.CompletedProcess(command, code, stdout=out, stderr="")

    monkeypatch.setattr(gpu_check.subprocess, "run", run)
    result = gpu_check.smoke_stage(tmp_path)
    assert [command[1:] for command in ran] == [[str(gpu_check.ROOT / "scripts" / "gpu_smoke.py"), part, str(tmp_path)]
                                               for part in ("fused",)]
    assert not result["fused"]["ok"] and "exit -11" in result["fused"]["error"]
    assert result["candidates"] == {"ok": False, "error": "skipped: the fused layers failed"}
    assert os.environ[gpu_step.NO_FUSED] == "1"
    assert gpu_step.unchecked(gpu_step.variant_env(gpu_step.FIVE_LAUNCHES))
    assert not gpu_step.unchecked(gpu_step.variant_env(gpu_step.VARIANTS["64-key blocks"]))
    loaded = tiny_run(rows=16, vocab_size=16)
    checked = gpu_bits.pdl_check(loaded, context=20, repeat=1)
    assert checked["fused"].startswith("skipped") and checked["default pdl"] is True and checked["pdl_exact"]
    assert "fused m16 pdl" not in checked and "five-launch row group" not in checked
    for flag in (gpu_step.NO_FUSED, gpu_step.NO_CANDIDATES):
        monkeypatch.setenv(flag, "")
        monkeypatch.delenv(flag)
    answers.update(fused=(1, '{"ok": false, "error": "ValueError: no"}\n'))
    result = gpu_check.smoke_stage(tmp_path)
    assert result["fused"]["error"] == "ValueError: no" and os.environ[gpu_step.NO_FUSED] == "1"
    monkeypatch.delenv(gpu_step.NO_FUSED)
    monkeypatch.delenv(gpu_step.NO_CANDIDATES)
    answers.update(fused=(0, '{"ok": true}\n'))
    ran.clear()
    assert gpu_check.smoke_stage(tmp_path)["fused"]["ok"] and gpu_step.NO_FUSED not in os.environ
    assert [command[2] for command in ran] == ["fused", "candidates"] and gpu_step.NO_CANDIDATES not in os.environ
    assert not gpu_step.fails_to_run(gpu_step.FIVE_LAUNCHES)
    assert not gpu_step.fails_to_run(gpu_step.EVERY_CANDIDATE, gpu_step.EVERY_TILES)
    answers.update(candidates=(1, '{"ok": false, "error": "RuntimeError: illegal address"}\n'))
    result = gpu_check.smoke_stage(tmp_path)
    assert result["fused"]["ok"] and not result["candidates"]["ok"] and os.environ[gpu_step.NO_CANDIDATES] == "1"
    assert not gpu_step.fails_to_run(gpu_step.FIVE_LAUNCHES) and gpu_step.fails_to_run(gpu_step.EVERY_CANDIDATE)
    assert gpu_step.fails_to_run(gpu_step.FIVE_LAUNCHES, gpu_step.EVERY_TILES)  # the candidates' tile
    assert gpu_step.unchecked(gpu_step.variant_env(gpu_step.VARIANTS["early keys"]))
    # the candidates ran, lm_head's screen after them did not: the screen
    # alone is off for the run
    monkeypatch.delenv(gpu_step.NO_CANDIDATES)
    answers.update(candidates=(0, '{"ok": true, "screen": {"ok": false, "error": "RuntimeError: illegal address"}, '
                                  '"attention_rows": {"ok": true}}\n'))
    result = gpu_check.smoke_stage(tmp_path)
    assert result["candidates"]["ok"] and gpu_step.NO_CANDIDATES not in os.environ
    assert os.environ[gpu_step.NO_SCREEN] == "1" and gpu_step.fails_to_run(gpu_step.EVERY_CANDIDATE)
    screenless = {name: value for name, value in gpu_step.EVERY_CANDIDATE.items() if name not in gpu_step.LM_SCREEN}
    assert not gpu_step.fails_to_run(screenless, gpu_step.EVERY_TILES)
    assert gpu_step.unchecked(gpu_step.variant_env(gpu_step.VARIANTS["fused m16 pdl/prefetch fold, fold attention, "
                                                                   "lm screen"]))
    grouped = gpu_step.VARIANTS["fused m16 pdl/prefetch fold, fold attention, attention rows 2"]
    assert not gpu_step.fails_to_run(grouped) and gpu_step.NO_ATTENTION_ROWS not in os.environ
    # ... and where attention's rows in groups failed: the pdl stage does not launch them either
    answers.update(candidates=(0, '{"ok": true, "screen": {"ok": true}, "attention_rows": {"ok": false}}\n'))
    monkeypatch.delenv(gpu_step.NO_SCREEN)
    gpu_check.smoke_stage(tmp_path)
    assert os.environ[gpu_step.NO_ATTENTION_ROWS] == "1" and gpu_step.fails_to_run(grouped)
    checked = gpu_bits.pdl_check(tiny_run(rows=16, vocab_size=16), context=20, repeat=1)
    assert checked["five-launch attention rows"].startswith("skipped") and not checked["same_bits"]["attention rows"]
    assert checked["five-launch early rows"] is True


def test_a_smoke_part_says_its_failure_in_one_json_line(monkeypatch, capsys):
    """scripts/gpu_smoke.py: a part that raises prints {"ok": false, "error": ...} and
    exits 1; an unknown part is refused by name."""
    import json

    gpu_smoke = pytest.importorskip("gpu_smoke")
    monkeypatch.setattr(gpu_smoke, "fused_part", lambda model_dir, env, tiles=None: 1 / 0)
    monkeypatch.setattr(sys, "argv", ["gpu_smoke.py", "fused", "/nowhere"])
    with pytest.raises(SystemExit) as exited:
        gpu_smoke.main()
    assert exited.value.code == 1
    assert json.loads(capsys.readouterr().out) == {"ok": False, "error": "ZeroDivisionError: division by zero"}
    monkeypatch.setattr(sys, "argv", ["gpu_smoke.py", "walk"])  # the walk was removed
    with pytest.raises(SystemExit, match="no part 'walk'; the parts: fused, candidates"):
        gpu_smoke.main()


def test_the_candidates_part_tries_lm_head_s_screen_last_and_apart(monkeypatch, capsys):
    """scripts/gpu_smoke.py's `candidates`: the candidates without the screen,
    then each tried apart on the model already loaded (the screen, attention's rows in
    groups); the screen's failure is its own, the part still ok (the check turns the
    screen alone off). Where the others fail, none is tried apart."""
    import json

    gpu_smoke = pytest.importorskip("gpu_smoke")
    calls = []

    def part(model_dir, env, tiles=None, loaded=None):
        calls.append((env.get("CODESPEC_CUDA_LM_SCREEN"), env.get("CODESPEC_CUDA_ATTENTION_ROWS"),
                      tiles is gpu_step.EVERY_TILES, loaded))
        if env.get("CODESPEC_CUDA_LM_SCREEN") == "1":
            raise RuntimeError("illegal address")
        return {"ok": True, "loaded": "the model"}

    monkeypatch.setattr(gpu_smoke, "fused_part", part)
    monkeypatch.setattr(sys, "argv", ["gpu_smoke.py", "candidates", "/nowhere"])
    with pytest.raises(SystemExit) as exited:
        gpu_smoke.main()
    assert exited.value.code == 0
    assert calls == [(None, None, True, None), ("1", None, True, "the model"), (None, "2", False, "the model")]
    assert json.loads(capsys.readouterr().out) == {"ok": True, "attention_rows": {"ok": True},
                                                   "screen": {"ok": False, "error": "RuntimeError: illegal address"}}
    calls.clear()
    monkeypatch.setattr(gpu_smoke, "fused_part", lambda *args, **kwargs: calls.append(args) or {"ok": False})
    with pytest.raises(SystemExit) as exited:
        gpu_smoke.main()
    assert exited.value.code == 1 and len(calls) == 1 and "screen" not in json.loads(capsys.readouterr().out)
