"""The greedy choice of the rows that hold a token (kernels/row_argmax.py) under the
Triton interpreter: torch.argmax's choice on every real row (ties to the first index,
a NaN as the largest, -inf rows, signed zeros, maxima on split edges), 0 on padding."""

from __future__ import annotations

import pytest
import torch

from codespec.kernels import row_argmax as module
from codespec.kernels.row_argmax import row_argmax, row_argmax_ref

pytest.importorskip("triton", reason="triton is a test dependency (pip install -e '.[test]')")


@pytest.mark.parametrize("dtype, block", [(torch.float32, 64), (torch.bfloat16, 64), (torch.bfloat16, 1024)])
def test_real_rows_get_torch_argmax_and_padding_rows_zero(dtype, block, monkeypatch):
    monkeypatch.setattr(module, "BLOCK", block)  # 64: 40 splits of 128 (the block rounds them), edges inside
    torch.manual_seed(0)
    vocab = 5000
    logits = torch.randn(10, vocab).to(dtype)
    logits[1, 128] = logits[1, 4000] = 60  # a tie in two splits: the first
    logits[2, 127] = logits[2, 128] = 60  # a tie across a split edge
    logits[3] = float("-inf")
    logits[4, 77] = logits[4, 3000] = float("nan")  # the first NaN
    logits[5, vocab - 1] = 99
    logits[6] = 0.0
    logits[6, 10] = -0.0
    logits[8, 0] = 70
    context = torch.tensor([5, 9, 3, 1, 2, 1, 1, 0, 4, 0])
    path_len = torch.tensor([0, 0, 0, 0, 0, 0, 0, 2, 0, 0])  # row 7: path only; row 9: padding
    got = row_argmax(logits, context, path_len, force_triton=True)
    assert torch.equal(got, row_argmax_ref(logits, context, path_len))
    live = context + path_len > 0
    assert torch.equal(got[live], torch.argmax(logits, dim=-1)[live]) and got[9] == 0
    assert got[1:6].tolist() == [128, 127, 0, 77, vocab - 1]


def test_one_split_a_row_and_a_short_vocabulary(monkeypatch):
    monkeypatch.setattr(module, "SPLITS", 1)
    logits = torch.tensor([[1.0, 3.0, 3.0, 2.0], [4.0, 4.0, 0.0, -1.0]])
    ones = torch.ones(2, dtype=torch.int64)
    assert row_argmax(logits, ones, 0 * ones, force_triton=True).tolist() == [1, 0]


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match=r"\[rows, vocab\]"):
        row_argmax(torch.zeros(4, 3).t(), torch.ones(3), torch.ones(3))
    with pytest.raises(ValueError, match="context and path_len"):
        row_argmax(torch.zeros(2, 3), torch.ones(3), torch.ones(2))


def test_the_backend_choosing_with_it_generates_the_same_tokens(monkeypatch):
    from codespec.engine import Engine, GenerationConfig
    from codespec.errors import SettingError
    from codespec.forward.cuda import CudaForward
    from codespec.models.tiny import tiny_model
    from codespec.policy.proposer import PromptLookupProposer
    from tests.test_engine_lossless import prompts

    model = tiny_model("qwen2", vocab_size=16, seed=3)
    outputs = []
    for setting in ("torch", "rows"):
        monkeypatch.setenv("CODESPEC_CUDA_ARGMAX", setting)
        forward = CudaForward(model, rows=8)
        assert forward.row_argmax == (setting == "rows")
        engine = Engine(forward, None, PromptLookupProposer(min_match_tokens=1), max_draft_tokens=8, eos_token_ids=[])
        outputs.append([engine.generate(p, GenerationConfig(max_new_tokens=16, speculate=speculate)).token_ids
                        for p in prompts(16, 3, seed=16, repeat=True) for speculate in (False, True)])
    assert outputs[0] == outputs[1]
    monkeypatch.setenv("CODESPEC_CUDA_ARGMAX", "fast")
    with pytest.raises(SettingError, match="CODESPEC_CUDA_ARGMAX"):
        CudaForward(model, rows=8)
