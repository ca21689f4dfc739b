"""The cuda backend's L2 warming (forward/prefetch.py): which weights each fork point
warms, its settings, and the backend running with it (on CPU, the interpreter's `load`
kernel at every fork point) computing what it computes without it."""

from __future__ import annotations

import pytest

from codespec.engine import Engine, GenerationConfig
from codespec.errors import SettingError
from codespec.forward import prefetch
from codespec.forward.cuda import CudaForward
from codespec.models.tiny import tiny_model
from codespec.policy.proposer import PromptLookupProposer
from tests.test_engine_lossless import prompts

pytest.importorskip("triton", reason="triton is a test dependency (pip install -e '.[test]')")


def test_each_weight_is_warmed_once_just_before_the_layer_that_reads_it():
    layers = 5
    plan = prefetch.plan(layers)
    warmed = [pair for pairs in plan.values() for pair in pairs]
    names = ("qkv", "o", "gate_up", "down")
    assert sorted(warmed) == sorted((i, name) for i in range(layers) for name in names)
    for (point, layer), pairs in plan.items():
        for warmed_layer, name in pairs:
            # the MLP's weights at its own layer's start; attention's at the MLP before it
            # (layer 0's at its start): never a layer ahead, so L2 holds one layer at a time
            if name in ("gate_up", "down") or warmed_layer == 0:
                assert (point, layer) == ("layer", warmed_layer)
            else:
                assert (point, layer) == ("mlp", warmed_layer - 1)


def test_a_bad_setting_fails_at_start_up(monkeypatch):
    model = tiny_model("qwen2", vocab_size=16, seed=3)
    monkeypatch.setenv("CODESPEC_CUDA_PREFETCH", "always")
    with pytest.raises(SettingError, match="CODESPEC_CUDA_PREFETCH='always'"):
        CudaForward(model, rows=4)
    monkeypatch.setenv("CODESPEC_CUDA_PREFETCH", "sector")
    monkeypatch.setenv("CODESPEC_CUDA_PREFETCH_PROGRAMS", "0")
    with pytest.raises(SettingError, match="CODESPEC_CUDA_PREFETCH_PROGRAMS"):
        CudaForward(model, rows=4)
    monkeypatch.setenv("CODESPEC_CUDA_PREFETCH_PROGRAMS", "64")
    forward = CudaForward(model, rows=4)
    assert forward.prefetch.mode == "sector" and forward.prefetch.programs == 64


@pytest.mark.parametrize("fused", [False, True])
def test_the_backend_warming_every_window_computes_the_same_tokens(fused):
    model = tiny_model("qwen2", vocab_size=16, seed=3)
    rows = 16 if fused else 8  # the fused products' tiles need 16
    plain = CudaForward(model, rows=rows, fused=fused)
    warming = CudaForward(model, rows=rows, fused=fused, prefetch="load", prefetch_programs=3)
    assert isinstance(warming.prefetch, prefetch.Prefetcher)
    warming.prefetch.force_triton = True  # the interpreter's kernel on the CPU's tensors
    layers = model.config.num_hidden_layers
    outputs = []
    for forward in (plain, warming):
        engine = Engine(forward, None, PromptLookupProposer(min_match_tokens=1), max_draft_tokens=16,
                        eos_token_ids=[])
        outputs.append([engine.generate(prompt, GenerationConfig(max_new_tokens=12)).token_ids
                        for prompt in prompts(16, 3, seed=16, repeat=True)])
    assert outputs[0] == outputs[1]
    # every replay forks each of its 2 * layers - 1 windows; the sink holds the kernel's sums
    assert warming.prefetch.launches > 0 and warming.prefetch.launches % (2 * layers - 1) == 0
    assert warming.prefetch.sink.any()
