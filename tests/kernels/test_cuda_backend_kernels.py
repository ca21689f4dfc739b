"""The cuda backend (forward/cuda.py) with the Triton kernels the GPU runs, executed by the
interpreter on CPU (elsewhere the CPU tests run the kernels' torch references through the
backend). The kernels compute only the rows that hold a token, a padding row's outputs
left undefined: the model's greedy output all the same, and speculation lossless against
plain decoding."""

from __future__ import annotations

import pytest
import torch

from codespec.engine import Engine, GenerationConfig
from codespec.engine.kvcache import DEFAULT_CHUNK, SlotCache
from codespec.forward.cuda import CudaForward
from codespec.models.tiny import tiny_model
from codespec.policy.proposer import PromptLookupProposer
from tests.kernels.interpreter_patch import PADDING_ROW_WARNINGS
from tests.test_engine_lossless import hf_greedy, prompts, speculation_checked

pytest.importorskip("triton", reason="triton is a test dependency (pip install -e '.[test]')")
pytestmark = PADDING_ROW_WARNINGS


@pytest.mark.parametrize("kernels, fused", [("products", True), pytest.param("all", True, marks=pytest.mark.slow),
                                            pytest.param("all", False, marks=pytest.mark.slow)])
def test_the_kernels_on_live_rows_give_the_models_output_and_stay_lossless(monkeypatch, kernels, fused):
    """`products`: the fused layers with row_linear's kernel for every product, splits of
    K summed by their last program (CODESPEC_CUDA_REDUCE=fold; ~1 s a pass interpreted);
    `all`: rotary, the KV store and attention through theirs too (~3.5 s a pass), in the
    fused layers and the default ones (their products in torch here; attention's `grid`
    schedule, CODESPEC_CUDA_ATTENTION, where the fused ones run the default worklist)."""
    if kernels == "products":
        monkeypatch.setenv("CODESPEC_CUDA_REDUCE", "fold")
    if not fused:
        monkeypatch.setenv("CODESPEC_CUDA_ATTENTION", "grid")
    from codespec.kernels import row_attention, row_linear, rope_store

    for module in (row_linear,) if kernels == "products" else (row_linear, row_attention, rope_store):
        monkeypatch.setattr(module, "use_triton", lambda tensor, force: True)  # CPU tensors: the interpreter
    monkeypatch.setenv("CODESPEC_CUDA_TILE_ROWS", "16")  # a bucket of two blocks of rows: a step computes one
    model = tiny_model("qwen2", vocab_size=16, seed=3, dtype=torch.float32)
    # Slots of two key blocks, not the model's whole context (16 blocks): the requests' keys
    # fill one, and the grid schedule's programs past a row's keys, each interpreted, made
    # up half the slow step's time (318 s of its 627 on the 2-core VM).
    cache = SlotCache(model.config, slots=2, slot_tokens=2 * row_attention.KEY_BLOCK, dtype=torch.float32,
                      device=torch.device("cpu"), chunk=DEFAULT_CHUNK)
    # the fused products' bucket of two blocks of 16 rows; the default layers' products run
    # in torch here, so their bucket is one block (half the interpreted programs)
    engine = Engine(CudaForward(model, rows=32 if fused else 16, fused=fused), None,
                    PromptLookupProposer(min_match_tokens=1), max_draft_tokens=12, eos_token_ids=[], cache=cache)
    cases = prompts(16, 2, seed=23, repeat=True)
    assert engine.generate(cases[0], GenerationConfig(max_new_tokens=6, speculate=False)).token_ids == \
        hf_greedy(model, cases[0], 6)
    accepted, rejected = speculation_checked(engine, cases, 12)
    assert accepted > 3 and rejected > 0
