"""The pdl stage (scripts/gpu_bits.py) on CPU: the kernels' references stand in for the
GPU's, so every check holds; what is tested is the plumbing: each check's entry, the
flags a failed check sets for the rest of the run, the environment restored, and where
a setting's bits part from the five-launch layers'."""

from __future__ import annotations

import pytest
import torch

from tests.gpu_run import tiny_run

gpu_step = pytest.importorskip("gpu_step")
gpu_bits = pytest.importorskip("gpu_bits")


def test_the_pdl_stage_runs_and_leaves_the_settings_as_it_found_them(monkeypatch):
    """On CPU the kernels' references run (no PDL): the stage's plumbing, every layout
    equal to itself, and the environment restored."""
    monkeypatch.setenv("CODESPEC_CUDA_ATTENTION", "grid")
    loaded = tiny_run(rows=64)
    result = gpu_bits.pdl_check(loaded, context=40, repeat=2)
    detail = result.pop("fused m16 pdl fold detail")
    assert result == {"default pdl": True, "fused m16 pdl": True, "fused m16 pdl fold": True,
                      "five-launch row group": True, "five-launch flags": True, "pdl_exact": True,
                      "fold_exact": True,
                      "five-launch pass row group": True, "five-launch early keys": True,
                      "five-launch early rows": True, "five-launch attention rows": True, "flags_gave_up": 0,
                      "same_bits": {"row group": True, "flags": True, "pass row group": True, "early keys": True,
                                    "early rows": True, "attention rows": True}}
    assert detail == {"same_bits_as_launch": True, "steady": True, "relative_error": 0.0}
    import os

    assert os.environ["CODESPEC_CUDA_ATTENTION"] == "grid" and "CODESPEC_CUDA_PDL" not in os.environ


def test_where_a_setting_parts_from_the_five_launch_layers_names_the_first_layer_and_rows():
    generator = torch.Generator().manual_seed(0)
    reference = torch.randn(8, 32, generator=generator)
    moved = reference.clone()
    moved[3, 5] += 1.0
    kv = [[(torch.randn(1, 2, 16, 4, generator=generator), torch.randn(1, 2, 16, 4, generator=generator))
           for _ in range(3)] for _ in range(2)]  # after the prefill, after the passes
    theirs = [[(k.clone(), v.clone()) for k, v in layers] for layers in kv]
    theirs[1][2][1][0, 1, 15, 0] += 1.0  # layer 2's values, after the passes alone
    detail = gpu_bits.where_bits_part(reference, [moved, moved.clone()], kv, theirs)
    assert detail["steady"] and detail["rows_differing"] == 1 and detail["relative_error"] > 0
    assert detail["prefill_first_layer_apart"] is None and detail["passes_first_layer_apart"] == "2 values"
    assert not gpu_bits.where_bits_part(reference, [moved, reference], kv, kv)["steady"]


def test_where_pdl_changes_a_bit_the_rest_of_the_run_goes_without_it(monkeypatch):
    """PDL is the default on Hopper (`auto`): where the pdl stage finds a logit changed,
    CODESPEC_CUDA_PDL=off for the rest of the run (the variants, the fresh processes of
    the exactness stages) and the run's backend is built again without it."""
    gpu_check = pytest.importorskip("gpu_check")
    for name in ("CODESPEC_CUDA_PDL", *gpu_step.CHECK_FLAGS):
        monkeypatch.setenv(name, "")  # recorded: the stage's own settings are undone after the test
        monkeypatch.delenv(name)
    loaded = tiny_run(rows=16, vocab_size=16)
    loaded.forward.pdl = "launch"  # as `auto` makes it on an H100
    real = torch.equal
    monkeypatch.setattr(torch, "equal", lambda a, b: False)  # every pass with PDL differs
    result = gpu_bits.pdl_check(loaded, context=20, repeat=1)
    monkeypatch.setattr(torch, "equal", real)
    import os

    assert result["pdl_exact"] is False and os.environ["CODESPEC_CUDA_PDL"] == "off"
    assert gpu_step.variant_env({})["CODESPEC_CUDA_PDL"] == "off"
    assert gpu_step.unchecked(gpu_step.variant_env(gpu_step.VARIANTS["fused m16 pdl/prefetch"]))
    own = loaded.forward
    gpu_check.take_settled(loaded)
    assert loaded.forward is not own and loaded.forward.pdl == "off"
