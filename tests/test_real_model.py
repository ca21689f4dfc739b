"""The embedded default model in its real dtype: lossless, and speculation pays off.

Runs in CI on every run (prepares the model from the pinned part packages on first use).
"""

from __future__ import annotations

import contextlib
import inspect
import json
import subprocess
import sys
import textwrap

import pytest

from codespec.engine.engine import Engine, GenerationConfig
from codespec.forward.select import of_model
from codespec.policy.proposer import PromptLookupProposer

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
    return Engine(default_model.forward, default_model.tokenizer, PromptLookupProposer(), max_draft_tokens=16)


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
        startup = out["startup"]  # where a fresh process's time went (bench cold start reads it)
        assert 0 < startup["imports_s"] < startup["first_token_s"] and startup["model_load_s"] > 0
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
    assert info["weights"] == info["path"] + "/bfloat16"  # the serving copy written by preparation
    assert info["profile"]["path"].endswith(".json") and isinstance(info["profile"]["stored"], bool)
    from codespec.kernels import rowgemm

    # the backend select.py chose, and why: torch-free where the C forward serves the model
    c_forward = rowgemm.library() is not None and rowgemm.isa() in (rowgemm.AMX, rowgemm.AVX512_BF16, rowgemm.AVX2)
    assert info["forward"]["backend"] == ("rowdecoder" if c_forward else "transformers"), info["forward"]
    assert info["forward"]["torch_free"] == c_forward and info["forward"]["exact"] and info["forward"]["reason"]


def test_serving_copy_holds_exactly_the_weights_a_float32_load_casts_to(default_model):
    import torch
    from transformers import AutoModelForCausalLM

    assert default_model.weights.endswith("bfloat16")
    cast = AutoModelForCausalLM.from_pretrained(default_model.path, dtype=torch.bfloat16).state_dict()
    # a fresh load: the session's model has its linear weights packed for oneDNN (rowblocks.py)
    served = AutoModelForCausalLM.from_pretrained(default_model.weights, dtype=torch.bfloat16).state_dict()
    assert cast.keys() == served.keys()
    assert all(torch.equal(cast[name], served[name]) for name in cast)


def test_fim_tokens_are_recognised_in_prompts(default_model):
    tok = default_model.tokenizer
    ids = tok("<|fim_prefix|>def f(<|fim_suffix|>", add_special_tokens=False)["input_ids"]
    assert ids[0] == tok.convert_tokens_to_ids("<|fim_prefix|>")
    assert ids[-1] == tok.convert_tokens_to_ids("<|fim_suffix|>")


FORWARDS = ["rowdecoder", "transformers"]


@pytest.mark.parametrize("forward", FORWARDS)
def test_tree_and_batch_rows_equal_decode_steps_bit_for_bit(default_model, forward):
    """The invariant behind losslessness in bf16: every row of a batched tree verify pass
    gives exactly the logits of the decode step it stands for, on and off the tree's
    main path, whatever else shares the pass; and a prompt prefilled on top of a reused
    prefix gives the same logits as a fresh prefill."""
    import torch

    from codespec.engine.kvcache import SlotCache
    from codespec.verify.tree import VerifyTree
    from codespec.verify.verifier import Verifier

    tok, model = default_model.tokenizer, default_model.model
    prompt = tok(PROMPTS["copy"], add_special_tokens=False)["input_ids"]
    other = tok(PROMPTS["class"], add_special_tokens=False)["input_ids"]
    chain = tok(inspect.getsource(textwrap.indent), add_special_tokens=False)["input_ids"][:10]
    # main path chain[0..9]; a branch off node 2 (two tokens) and one off node 5
    tokens = (*chain, 11, 12, 13)
    parents = (-1, *range(9), 2, 10, 5)
    depths = (*range(10), 3, 4, 6)
    tree = VerifyTree(tokens, parents, depths, tuple(range(len(tokens) - 1)))
    cache = SlotCache(model.config, slots=4, slot_tokens=512, dtype=model.dtype, chunk=16)
    for node, row, step in _pass_rows_and_decode_steps(model, cache, prompt, tree, other, other[:3], (9, 11, 12),
                                                       forward):
        assert torch.equal(row, step), f"node {node} differs from its decode step"
    verifier = Verifier(of_model(model, backend=forward), cache)
    long_prompt = tok(inspect.getsource(textwrap.wrap) * 3, add_special_tokens=False)["input_ids"][:100]
    fresh, _ = cache.acquire([-2])
    expected = verifier.prefill(fresh, long_prompt)
    cache.release(fresh)
    # transformers' forward reuses whole passes (five chunks of the shared 90 tokens; then
    # six and a sub-chunk of the last chunk); the row decoder, whose prefill rows are decode
    # steps (Forward.prefill_exact), every shared token (90; then all but the last)
    exact = verifier.forward.prefill_exact
    shared, again = (90, 99) if exact else (80, 98)
    variant = long_prompt[:90] + [7] * 20
    assert cache.acquire(variant) == (fresh, shared)
    variant_logits = verifier.prefill(fresh, variant, start=shared)
    cache.release(fresh)
    assert cache.acquire(long_prompt) == (fresh, shared)  # the variant's slot
    assert same(verifier.prefill(fresh, long_prompt, start=shared), expected)
    cache.release(fresh)
    assert cache.acquire(long_prompt) == (fresh, again)
    assert same(verifier.prefill(fresh, long_prompt, start=again), expected)
    assert not same(variant_logits, expected)


def same(a, b) -> bool:
    """Bit-equal logits, as tensors (transformers) or the row decoder's bf16 bits (numpy)."""
    import numpy as np
    import torch

    if isinstance(a, np.ndarray):
        return a.shape == b.shape and a.dtype == b.dtype and bool((a == b).all())
    return torch.equal(a, b)


def test_passes_past_one_row_block_equal_decode_steps_bit_for_bit(default_model):
    """bf16 linear layers switch kernels past some row count on some CPUs (32 on an
    Intel VM; none up to 64 on an AVX-512 BF16 EPYC; rowblocks.py): a 40-row verify pass
    multiplied in blocks must still give every row its decode step's logits."""
    import torch

    from codespec.engine.kvcache import SlotCache
    from codespec.verify.tree import VerifyTree
    from codespec.verify.verifier import Item, Verifier

    tok, model = default_model.tokenizer, default_model.model
    prompt = tok(PROMPTS["copy"], add_special_tokens=False)["input_ids"]
    chain = tok(inspect.getsource(textwrap.wrap) * 2, add_special_tokens=False)["input_ids"][:40]
    cache = SlotCache(model.config, slots=1, slot_tokens=512, dtype=model.dtype, chunk=16)
    forward = of_model(model, backend="transformers")
    verifier = Verifier(forward, cache)
    # any block up to the probed one is exact; 16 makes the pass span three (14 + 13 + 13)
    forward.row_block = min(forward.row_block, 16)
    assert 3 <= forward.row_block < len(chain) / 2
    with captured_logits(forward) as captured:
        slot, _ = cache.acquire(prompt)
        verifier.prefill(slot, prompt)
        verifier.verify([Item(slot, VerifyTree.chain(chain[0], chain[1:]))])
        rows = captured[-1][: len(chain)]
        cache.release(slot)
        slot, _ = cache.acquire([-1])
        verifier.prefill(slot, prompt)
        for i, token in enumerate(chain):
            captured.clear()
            verifier.verify([Item(slot, VerifyTree.chain(token))])
            assert torch.equal(rows[i], captured[-1][0]), f"row {i} differs from its decode step"


def _fim_cut_json_decode(tok):
    """A FIM request: json/decoder.py with the body of JSONDecoder.decode cut out."""
    import ast
    import json.decoder

    text = inspect.getsource(json.decoder)
    node = next(n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.FunctionDef) and n.name == "decode")
    lines = text.splitlines(keepends=True)
    start = sum(len(line) for line in lines[: node.body[1].lineno - 1])  # after the docstring
    end = sum(len(line) for line in lines[: node.end_lineno])
    prefix, suffix = text[:start][-3000:], text[end:][:800]
    special = tok.convert_tokens_to_ids
    encode = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    ids = [special("<|fim_prefix|>"), *encode(prefix), special("<|fim_suffix|>"), *encode(suffix),
           special("<|fim_middle|>")]
    return ids, prefix, suffix


def test_repository_index_drafts_a_fim_answer_found_elsewhere(default_model, tmp_path):
    """The answer exists in another file of the indexed repository: the index drafts it
    (several tokens per pass) where prompt-only lookup accepts about one; output equal."""
    from codespec.index import SuffixIndex
    from codespec.indexing import build_repository_index
    from codespec.policy.proposer import IndexedProposer

    tok = default_model.tokenizer
    ids, prefix, suffix = _fim_cut_json_decode(tok)
    prompt_only = Engine(default_model.forward, tok, PromptLookupProposer(), max_draft_tokens=16)
    plain = prompt_only.generate(ids, GenerationConfig(max_new_tokens=64, speculate=False))
    lookup = prompt_only.generate(ids, GenerationConfig(max_new_tokens=64))
    repo = tmp_path / "repo"
    (repo / "vendored").mkdir(parents=True)
    # a vendored copy of the module, complete with the body the model is about to write
    (repo / "vendored" / "decoder.py").write_text(prefix[-1500:] + plain.text + suffix)
    (repo / "other.py").write_text("import json\n\nprint(json.dumps({}))\n")
    build_repository_index(repo, tok, tmp_path / "repo.csidx", progress=False)
    index = SuffixIndex.load(tmp_path / "repo.csidx")
    indexed = Engine(default_model.forward, tok, IndexedProposer(index, record_generations=False), max_draft_tokens=16)
    out = indexed.generate(ids, GenerationConfig(max_new_tokens=64))
    assert out.token_ids == plain.token_ids == lookup.token_ids
    assert lookup.stats.accepted_tokens_per_pass < 1.6, lookup.stats.to_json()
    assert out.stats.accepted_tokens_per_pass > 3, out.stats.to_json()
    assert out.stats.accepted_by_source["static"] > 30


def test_past_generations_draft_a_repeated_request(default_model):
    """An agent resends a request: the first answer, now in the dynamic index, drafts
    the second."""
    from codespec.index import SuffixIndex
    from codespec.policy.proposer import IndexedProposer

    tok = default_model.tokenizer
    ids, _, _ = _fim_cut_json_decode(tok)
    engine = Engine(default_model.forward, tok, IndexedProposer(SuffixIndex()), max_draft_tokens=16)
    first = engine.generate(ids, GenerationConfig(max_new_tokens=48))
    second = engine.generate(ids, GenerationConfig(max_new_tokens=48))
    assert second.token_ids == first.token_ids
    assert second.stats.accepted_by_source["dynamic"] > 30
    assert second.stats.accepted_tokens_per_pass > 3 * first.stats.accepted_tokens_per_pass / 2


@pytest.mark.parametrize("forward", FORWARDS)
def test_long_context_rows_equal_decode_steps_bit_for_bit(default_model, forward):
    """At contexts past 1k tokens, rows of one verify pass met other attention
    kernel shapes than their decode steps (a short last key block, query heads straddling
    query blocks) on some CPUs. A pass whose chain crosses a key-block edge, with a
    branch and a second request beside it, must give every row its decode step's bits."""
    import torch

    from codespec.forward import rowplan
    from codespec.engine.kvcache import SlotCache
    from codespec.verify.tree import VerifyTree

    tok, model = default_model.tokenizer, default_model.model
    source = inspect.getsource(textwrap) + inspect.getsource(json.decoder)
    ids = tok(source, add_special_tokens=False)["input_ids"]
    edge = 3 * rowplan.KEY_BLOCK
    prompt = ids[: edge - 12]  # the chain's rows see 1525.. keys: the pass crosses 1536
    chain = ids[edge - 12 : edge + 14]
    other = ids[300:1400]
    tokens = (*chain, 11, 12)  # a branch of two tokens off node 4
    parents = (-1, *range(len(chain) - 1), 4, len(chain))
    depths = (*range(len(chain)), 5, 6)
    tree = VerifyTree(tokens, parents, depths, tuple(range(len(tokens) - 1)))
    cache = SlotCache(model.config, slots=3, slot_tokens=2048, dtype=model.dtype)
    leaves = (len(chain) - 1, len(tokens) - 1)
    for node, row, step in _pass_rows_and_decode_steps(model, cache, prompt, tree, other, other[:5], leaves,
                                                       forward):
        assert torch.equal(row, step), f"node {node} differs from its decode step"


@contextlib.contextmanager
def captured_logits(forward):
    """Every verify pass's logits rows (the pass's real rows, in packing order), whichever
    backend computed them (its greedy choices come from these logits: screen=False)."""
    captured: list = []
    compute = forward.logits

    def spy(cache, requests):
        logits = compute(cache, requests)
        captured.append(forward.tensor(logits).float().clone())
        return logits

    forward.logits = spy
    try:
        yield captured
    finally:
        del forward.logits


def _pass_rows_and_decode_steps(model, cache, prompt, tree, other, side_draft, leaves, forward):
    """One verify pass over a side request (`other` drafting `side_draft`) and `tree`
    after `prompt`, and the reference: teacher-forced decode steps in a fresh slot along
    the paths to `leaves`. Returns (node, the pass's logits row, the decode step's)."""
    from codespec.verify.tree import VerifyTree
    from codespec.verify.verifier import Item, Verifier

    backend = of_model(model, backend="" if forward == "rowdecoder" else "transformers", screen=False)
    verifier = Verifier(backend, cache)
    with captured_logits(backend) as captured:
        batch_slot, _ = cache.acquire(prompt)
        side_slot, _ = cache.acquire(other)
        verifier.prefill(batch_slot, prompt)
        verifier.prefill(side_slot, other)
        captured.clear()
        verifier.verify([Item(side_slot, VerifyTree.chain(other[-1], side_draft)), Item(batch_slot, tree)])
        rows = captured[-1][len(side_draft) + 1 :]  # the side request's rows come first
        cache.release(batch_slot)
        cache.release(side_slot)
        found = []
        for leaf in leaves:
            slot, _ = cache.acquire([-1])
            verifier.prefill(slot, prompt)
            for node in tree.path(leaf):
                captured.clear()
                verifier.verify([Item(slot, VerifyTree.chain(tree.tokens[node]))])
                found.append((node, rows[node], captured[-1][0]))
            cache.release(slot)
        return found


def test_bench_cold_hf_worker_reports_like_generate(tmp_path):
    """The HF prompt-lookup worker of `codespec bench cold` runs in its own process and
    answers with generate's JSON fields (token ids, stats, startup)."""
    prompt = tmp_path / "prompt.txt"
    prompt.write_text(PROMPTS["copy"])
    proc = subprocess.run([sys.executable, "-m", "codespec.bench.cold", str(prompt), "12"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(out["token_ids"]) == out["stats"]["generated_tokens"] <= 12
    assert 0 < out["startup"]["model_load_s"] < out["startup"]["first_token_s"]


def test_a_prompt_prefilled_ahead_then_asked_equals_no_spec(default_model):
    """The language server's idle-time prefill in the real dtype: whole chunks
    computed ahead, one of them pre-empted mid-way, then the request speculating; its
    tokens equal a fresh engine's with speculation off."""
    from codespec.engine.kvcache import SlotCache

    tok = default_model.tokenizer

    def fresh_engine():
        cache = SlotCache(default_model.forward.config, slots=2, slot_tokens=512,
                          dtype=default_model.forward.kv_dtype, chunk=32)
        return Engine(default_model.forward, tok, PromptLookupProposer(), max_draft_tokens=8, cache=cache)

    prompt = tok(PROMPTS["copy"], add_special_tokens=False)["input_ids"]
    config = GenerationConfig(max_new_tokens=32)
    expected = fresh_engine().generate(prompt, GenerationConfig(max_new_tokens=32, speculate=False)).token_ids
    engine = fresh_engine()
    asked = []
    # asked between layers (transformers' layers and the C row decoder's alike): the pass is dropped
    assert engine.prefill_ahead(prompt, preempted=lambda: asked.append(1) or len(asked) > 5) == 0
    assert len(asked) == 6
    computed = []
    while (n := engine.prefill_ahead(prompt)) is not None:
        computed.append(n)
    out = engine.generate(prompt, config)
    assert out.stats.cached_prompt_tokens == sum(computed) == engine.cache.reusable_end(len(prompt))
    assert out.token_ids == expected
