"""The cuda backend (forward/cuda/forward.py) with the Triton kernels the GPU runs, executed by the
interpreter on CPU (elsewhere the CPU tests run the kernels' torch references through the
backend). The kernels compute only the rows that hold a token, a padding row's outputs
left undefined: the model's greedy output all the same, and speculation lossless against
plain decoding."""

from __future__ import annotations

import pytest
import torch

from codespec.engine.engine import Engine, GenerationConfig
from codespec.engine.kvcache import DEFAULT_CHUNK, SlotCache
from codespec.forward.cuda.forward import CudaForward
from codespec.forward.cuda.settings import CudaSettings
from tests.tiny import tiny_model
from codespec.policy.proposer import PromptLookupProposer
from tests.kernels.interpreter_patch import PADDING_ROW_WARNINGS
from tests.test_engine_lossless import hf_greedy, prompts, speculation_checked

pytest.importorskip("triton", reason="triton is a test dependency (pip install -e '.[test]')")
pytestmark = PADDING_ROW_WARNINGS


@pytest.mark.slow
def test_the_kernels_on_live_rows_give_the_models_output_and_stay_lossless(monkeypatch):
    """Rotary, the KV store and attention through their Triton kernels (~3.5 s a pass
    interpreted), the products in torch here."""
    from codespec.forward.cuda import attention, rope_store

    for module in (attention, rope_store):
        monkeypatch.setattr(module, "use_triton", lambda tensor, force: True)  # CPU tensors: the interpreter
    model = tiny_model("qwen2", vocab_size=16, seed=3, dtype=torch.float32)
    # Slots of two key blocks, not the model's whole context (16 blocks): the requests' keys fill one
    cache = SlotCache(model.config, slots=2, slot_tokens=2 * attention.KEY_BLOCK, dtype=torch.float32,
                      device=torch.device("cpu"), chunk=DEFAULT_CHUNK)
    engine = Engine(CudaForward(model, CudaSettings(rows=16)), None, PromptLookupProposer(min_match_tokens=1),
                    max_draft_tokens=12, eos_token_ids=[], cache=cache)
    cases = prompts(16, 2, seed=23, repeat=True)
    assert engine.generate(cases[0], GenerationConfig(max_new_tokens=6, speculate=False)).token_ids == \
        hf_greedy(model, cases[0], 6)
    accepted, rejected = speculation_checked(engine, cases, 12)
    assert accepted > 3 and rejected > 0
