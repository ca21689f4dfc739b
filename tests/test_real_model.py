"""The embedded default model in its real dtype: lossless, and speculation pays off.

Runs in CI on every run (prepares the model from the pinned part packages on first use).
"""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
import textwrap

import pytest

from codespec.engine import Engine, GenerationConfig
from codespec.proposer import PromptLookupProposer

pytestmark = pytest.mark.model

PROMPTS = {
    "function": "def fibonacci(n: int) -> int:\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "class": (
        "class Vector:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n\n"
        "    def __add__(self, other):\n        return Vector(self.x + other.x, self.y + other.y)\n\n"
        "    def __sub__(self, other):\n"
    ),
    # copy-heavy: the answer repeats code that is in the prompt
    "copy": "# Original\n" + inspect.getsource(textwrap.indent) + "\n# Identical copy of the function above\n",
}


@pytest.fixture(scope="module")
def engine(default_model):
    return Engine(default_model.model, default_model.tokenizer, PromptLookupProposer(), max_draft_tokens=16)


@pytest.mark.parametrize("name", list(PROMPTS))
def test_identical_with_and_without_speculation(default_model, engine, name):
    ids = default_model.tokenizer(PROMPTS[name], add_special_tokens=False)["input_ids"]
    plain = engine.generate(ids, GenerationConfig(max_new_tokens=48, speculate=False))
    spec = engine.generate(ids, GenerationConfig(max_new_tokens=48))
    assert spec.token_ids == plain.token_ids
    assert spec.text == plain.text
    if name == "copy":
        assert spec.stats.accepted_tokens_per_pass > 1.5, spec.stats.to_json()


def test_generate_json_contract(tmp_path):
    prompt = tmp_path / "prompt.txt"
    prompt.write_text(PROMPTS["copy"])
    outputs = {}
    for flag in ([], ["--no-spec"]):
        proc = subprocess.run(
            [sys.executable, "-m", "codespec", "generate", "--json", "--max-new-tokens", "24", *flag, str(prompt)],
            capture_output=True, text=True, timeout=600,
        )
        assert proc.returncode == 0, proc.stderr
        lines = proc.stdout.strip().splitlines()
        assert len(lines) == 1  # exactly one JSON object on stdout
        out = json.loads(lines[0])
        assert {"text", "token_ids", "stats"} <= out.keys()
        assert {"generated_tokens", "verify_passes", "accepted_tokens_per_pass", "draft_tokens", "ttft_s",
                "wall_s"} <= out["stats"].keys()
        outputs[bool(flag)] = out
    assert outputs[True]["token_ids"] == outputs[False]["token_ids"]
    assert outputs[True]["stats"]["draft_tokens"] == 0
    assert outputs[False]["stats"]["accepted_tokens_per_pass"] > 1


def test_model_info_json_path_loads_with_transformers():
    proc = subprocess.run([sys.executable, "-m", "codespec", "model", "info", "--json"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["name"] == "Qwen2.5-Coder-0.5B-Instruct" and info["dtype"] == "bfloat16"
    assert info["parameters"] > 400_000_000
    from transformers import AutoConfig

    assert AutoConfig.from_pretrained(info["path"]).model_type == "qwen2"


def test_fim_tokens_are_recognised_in_prompts(default_model):
    tok = default_model.tokenizer
    ids = tok("<|fim_prefix|>def f(<|fim_suffix|>", add_special_tokens=False)["input_ids"]
    assert ids[0] == tok.convert_tokens_to_ids("<|fim_prefix|>")
    assert ids[-1] == tok.convert_tokens_to_ids("<|fim_suffix|>")


def test_verify_rows_equal_decode_steps_bit_for_bit(default_model):
    """The invariant behind losslessness in bf16: a row of a multi-token verify pass
    gives exactly the logits of the decode step it replaces."""
    import torch

    from codespec.verifier import ChainVerifier

    tok = default_model.tokenizer
    prompt = tok(PROMPTS["copy"], add_special_tokens=False)["input_ids"]
    chain = tok(inspect.getsource(textwrap.indent), add_special_tokens=False)["input_ids"][:12]
    verifier = ChainVerifier(default_model.model)
    assert verifier.rows_exact
    captured: list[torch.Tensor] = []
    model = default_model.model
    hook = model.lm_head.register_forward_hook(lambda m, i, o: captured.append(o[0].float().clone()))
    try:
        multi = verifier.new_cache()
        verifier.prefill(multi, prompt)
        single = verifier.new_cache()
        verifier.prefill(single, prompt)
        captured.clear()
        verifier.verify(multi, chain[0], chain[1:])  # logits of every row, whatever is accepted
        multi_logits = captured[-1]
        for i, token in enumerate(chain):  # teacher-forced decode steps over the same chain
            captured.clear()
            verifier.verify(single, token, [])
            assert torch.equal(captured[-1][0], multi_logits[i]), f"row {i} differs"
    finally:
        hook.remove()
