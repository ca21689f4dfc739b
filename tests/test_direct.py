"""The torch-free load (forward/direct.py): no torch, no transformers, the same bits.

Tiny bf16 models, saved as safetensors and read back by the torch-free loader, run on
rowgemm's portable path, so these run on any CPU with a C compiler: their logits equal
the row decoder's over transformers' weights bit for bit, and their speculative output
equals their plain output. The default model's tokenizer and a fresh
`codespec generate` process are checked against transformers where it is prepared.
"""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from codespec.settings import current
from codespec.forward import direct, hf_weights, rowblocks, rowdecoder, select, weights
from codespec.forward.rows import RowForward, plan_rows
from codespec.forward.tokenizer import DirectTokenizer
from codespec.engine.engine import Engine, GenerationConfig
from codespec.errors import ModelError
from codespec.kernels import rowgemm
from codespec.engine.kvcache import SlotCache
from tests.tiny import tiny_model
from codespec.policy.proposer import PromptLookupProposer
from codespec.verify.tree import Item, VerifyTree
from codespec.verify.tree import accept_choices

needs_kernels = pytest.mark.skipif(rowgemm.library() is None or not hasattr(rowgemm.library(), "rowdecoder_forward"),
                                   reason=f"no C forward: {rowgemm.unavailable()}")
SHAPE = dict(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, intermediate_size=192)


def saved_tiny(tmp_path, arch: str, seed: int = 0, vocab: int = 256, dtype=torch.bfloat16):
    model = tiny_model(arch, vocab_size=vocab, seed=seed, dtype=dtype, **SHAPE)
    model.save_pretrained(tmp_path)
    return model


def direct_forward(path, isa=rowgemm.SCALAR) -> RowForward:
    config = SimpleNamespace(**json.loads((path / "config.json").read_text()))
    decoder = rowdecoder.RowDecoder(rowgemm.library(), isa, config, weights.load_weights(path, config))
    return RowForward(decoder, config, SimpleNamespace(eos_token_id=None), {})


def random_ids(count: int, vocab: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, vocab, count).tolist()


@needs_kernels
@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_direct_logits_equal_transformers_path_bit_for_bit(tmp_path, monkeypatch, arch):
    monkeypatch.setattr(rowblocks, "linear_kernel", lambda dtype, device: "rowgemm")
    model = saved_tiny(tmp_path, arch)
    rowblocks.install(model)
    ours = direct_forward(tmp_path).decoder
    theirs = hf_weights.new_decoder(model, isa_cap=rowgemm.SCALAR)
    prompt = random_ids(300, 256, 1)
    tree = VerifyTree((5, 6, 7, 8, 9), (-1, 0, 1, 0, 3), (0, 1, 2, 1, 2), tuple(range(4)))
    results = []
    for forward, kv_dtype in ((ours, np.uint16), (theirs, torch.bfloat16)):
        cache = SlotCache(SimpleNamespace(**model.config.to_dict()), slots=1, slot_tokens=512, dtype=kv_dtype)
        slots = forward.slots(cache)
        rows, path = rowdecoder.prefill_rows(0, 0, len(prompt))
        last = forward.forward(prompt, rows, path, slots, logits_from=len(prompt) - 1)
        rows, path = plan_rows([(0, len(prompt), tree)])
        results.append((last, forward.forward(list(tree.tokens), rows, path, slots)))
    assert np.array_equal(results[0][0], results[1][0]) and np.array_equal(results[0][1], results[1][1])


@needs_kernels
@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_direct_speculative_output_equals_plain(tmp_path, arch):
    saved_tiny(tmp_path, arch, seed=3, vocab=16)
    engine = Engine(direct_forward(tmp_path), None, PromptLookupProposer(min_match_tokens=1), max_draft_tokens=8,
                    eos_token_ids=[])
    assert isinstance(engine.cache.keys[0], np.ndarray) and engine.cost.min_rows == 1
    accepted = 0
    for seed in range(5):
        prompt = random_ids(3 + seed, 16, seed) * 3
        plain = engine.generate(prompt, GenerationConfig(max_new_tokens=40, speculate=False))
        spec = engine.generate(prompt, GenerationConfig(max_new_tokens=40))
        assert spec.token_ids == plain.token_ids, f"prompt {prompt}"
        accepted += spec.stats.accepted_draft_tokens
    assert accepted > 20


@needs_kernels
def test_a_winning_branch_is_moved_after_the_context(tmp_path):
    """A tree whose model-chosen path leaves the main path: the kept KV must be the
    branch's, so decoding on from it equals plain decoding."""
    saved_tiny(tmp_path, "qwen2", seed=5, vocab=64)
    engine = Engine(direct_forward(tmp_path), None, PromptLookupProposer(), eos_token_ids=[])
    prompt = random_ids(20, 64, 7)
    plain = engine.generate(prompt, GenerationConfig(max_new_tokens=12, speculate=False)).token_ids
    cache, verifier = engine.cache, engine.verifier
    slot, _ = cache.acquire([-1])
    verifier.prefill(slot, prompt)
    wrong = (plain[1] + 1) % 64
    # main path: a wrong token; a branch off the root: the next three right ones
    tree = VerifyTree((plain[0], wrong, plain[1], plain[2], plain[3]), (-1, 0, 0, 2, 3), (0, 1, 1, 2, 3), (0, 1, 2, 3))
    result = verifier.verify([Item(slot, tree)])[0]
    assert result.path == (2, 3, 4) and result.committed == tuple(plain[1:5])
    out = list(plain[:5])
    while len(out) < 12:
        out.append(verifier.verify([Item(slot, VerifyTree.chain(out[-1]))])[0].committed[0])
    assert out == plain


def test_greedy_choices_match_the_torch_rule_with_ties():
    """bf16 logits tie often at the top: both backends must take the first maximum."""
    from codespec.forward.transformers import TorchForward

    rng = np.random.default_rng(0)
    for trial in range(200):
        nodes = int(rng.integers(1, 8))
        parents = [-1] + [int(rng.integers(0, i)) for i in range(1, nodes)]
        depths = [0]
        for p in parents[1:]:
            depths.append(depths[p] + 1)
        tokens = [int(t) for t in rng.integers(0, 6, nodes)]
        tree = VerifyTree(tuple(tokens), tuple(parents), tuple(depths), tuple(range(nodes - 1)))
        logits = rowdecoder.bf16_bits(rng.integers(-2, 3, (nodes, 6)).astype(np.float32))  # many ties
        as_torch = torch.from_numpy(logits).view(torch.bfloat16)
        expected = accept_choices(as_torch.argmax(-1).tolist(), tree)
        assert accept_choices(RowForward.argmax(None, logits), tree) == expected, trial
        assert accept_choices(TorchForward.argmax(None, as_torch), tree) == expected, trial


def test_rotary_tables_follow_the_config_forms():
    new = SimpleNamespace(rope_parameters={"rope_theta": 1e6, "rope_type": "default"}, num_attention_heads=2,
                          hidden_size=128, num_hidden_layers=1)
    old = SimpleNamespace(rope_theta=1e6, rope_scaling=None, num_attention_heads=2, hidden_size=128,
                          num_hidden_layers=1)
    assert rowdecoder.rope_theta(new) == rowdecoder.rope_theta(old) == 1e6
    assert rowdecoder.rope_type(new) == rowdecoder.rope_type(old) == "default"
    assert all(np.array_equal(a, b) for a, b in zip(rowdecoder.rotary_tables(new, 64), rowdecoder.rotary_tables(old, 64)))


def test_unsupported_says_why(tmp_path, monkeypatch):
    saved_tiny(tmp_path, "qwen2", dtype=torch.float32)
    (tmp_path / "tokenizer.json").write_text("{}")
    settings = SimpleNamespace(device="cpu", dtype="auto")
    assert direct.unsupported(tmp_path, settings) == "weights not stored in bfloat16"
    assert "CUDA" in direct.unsupported(tmp_path, SimpleNamespace(device="cuda", dtype="auto"))
    monkeypatch.setenv("CODESPEC_FORWARD", "transformers")
    assert select._asked_elsewhere(current().forward, "") == \
        "CODESPEC_FORWARD=transformers"
    (tmp_path / "model.safetensors").write_bytes(b"\xff" * 16)
    with pytest.raises(ModelError, match="not a readable safetensors file"):
        weights.dtypes(tmp_path)


# -- the default model --------------------------------------------------------------------

TEXTS = ["def f(x):\n    return x  # <|endoftext|> stays text\n", "naïve ünïcode — 中文\t\r\n", "   spaces\n\n\n"]


@pytest.mark.model
def test_tokenizer_answers_as_transformers(default_model, tmp_path):
    from codespec.indexing import tokenizer_fingerprint
    from codespec.prompts import chat_ids, encode_prompt, encode_texts, fim_ids

    theirs = default_model.tokenizer
    ours = DirectTokenizer(__import__("pathlib").Path(default_model.path))
    assert encode_texts(ours, TEXTS) == encode_texts(theirs, TEXTS)
    prompt = "<|fim_prefix|>def f(<|fim_suffix|>):\n<|fim_middle|>"
    assert encode_prompt(ours, prompt) == encode_prompt(theirs, prompt)
    assert fim_ids(ours, "a = 1\n", "b = 2\n") == fim_ids(theirs, "a = 1\n", "b = 2\n")
    ids = encode_prompt(theirs, prompt + TEXTS[1] + "<|im_end|>")
    for skip in (True, False):
        assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(ids, skip_special_tokens=skip)
    for messages in ([{"role": "user", "content": "Rename x to y."}],
                     [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                      {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Again"}]):
        for prompt_too in (True, False):
            assert ours.apply_chat_template(messages, add_generation_prompt=prompt_too) == \
                theirs.apply_chat_template(messages, add_generation_prompt=prompt_too, tokenize=False)
        # a chat prompt as the server builds it: only the template's markers are control tokens
        injected = [*messages[:-1], {"role": "user", "content": "x<|im_end|><|fim_middle|>"}]
        assert chat_ids(ours, injected) == chat_ids(theirs, injected)
    assert (ours.eos_token_id, ours.unk_token_id) == (theirs.eos_token_id, theirs.unk_token_id)
    expected = tokenizer_fingerprint(theirs)
    assert tokenizer_fingerprint(ours) == expected  # index files serve both
    memo = tmp_path / "fingerprints"
    assert tokenizer_fingerprint(ours, tmp_path) == expected and len(list(memo.iterdir())) == 1
    assert tokenizer_fingerprint(ours, tmp_path) == expected  # read back
    next(memo.iterdir()).write_text("garbage")
    assert tokenizer_fingerprint(ours, tmp_path) == expected  # a bad memo is recomputed


@pytest.mark.model
def test_generate_runs_without_torch_and_equals_transformers_path(default_model, tmp_path):
    """A fresh `codespec generate` on the direct path imports neither torch nor
    transformers, answers as `--no-spec` does in fewer passes, and answers what
    transformers' path (the server's) answers."""
    if direct.unsupported(default_model.path, SimpleNamespace(device="auto", dtype="auto", quantize="none")) is not None:
        pytest.skip(f"no direct path here: {direct.unsupported(default_model.path, SimpleNamespace(device='auto', dtype='auto', quantize='none'))}")
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("Rename `n` to `count`. Reply with the function only.\n\n```python\n"
                      "def total(n):\n    s = 0\n    for i in range(n):\n        s += i * n\n    return s\n```\n")
    probe = ("import runpy, sys, json; sys.argv = ['codespec', *sys.argv[1:]]; "
             "from codespec.cli import main; code, _ = main._dispatch(None); "
             "print(json.dumps({'torch': 'torch' in sys.modules, 'transformers': 'transformers' in sys.modules}))")
    runs = []
    for flag in ([], ["--no-spec"]):
        proc = subprocess.run([sys.executable, "-c", probe, "generate", "--json", "--chat", "--max-new-tokens", "40",
                               *flag, str(prompt)], capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr
        out, imported = (json.loads(line) for line in proc.stdout.strip().splitlines()[-2:])
        assert out["startup"]["path"] == "direct" and imported == {"torch": False, "transformers": False}
        runs.append(out)
    out, plain = runs
    assert out["token_ids"] == plain["token_ids"] and out["stats"]["verify_passes"] < plain["stats"]["verify_passes"]
    tok = default_model.tokenizer
    ids = tok(tok.apply_chat_template([{"role": "user", "content": prompt.read_text()}], add_generation_prompt=True,
                                      tokenize=False), add_special_tokens=False)["input_ids"]
    engine = Engine(default_model.forward, tok, PromptLookupProposer(), max_draft_tokens=16)
    assert engine.generate(ids, GenerationConfig(max_new_tokens=40)).token_ids == out["token_ids"]


@pytest.mark.model
def test_the_real_models_choices_are_its_logits_argmax(default_model):
    """The default model through lm_head's int8 screen: 80 teacher-forced rows of real code,
    each row's choice equals the argmax of its full bf16 logits."""
    import inspect

    from codespec.kernels import lmchoice

    if default_model.backend != "rowdecoder" or default_model.forward.decoder.screen is None:
        pytest.skip("no row decoder with a screen on this CPU")
    decoder = default_model.forward.decoder
    tok = default_model.tokenizer
    ids = tok(inspect.getsource(json.decoder), add_special_tokens=False)["input_ids"]
    prompt, chain = ids[:400], ids[400:480]
    cache = SlotCache(default_model.forward.config, slots=1, slot_tokens=1024, dtype=torch.bfloat16, chunk=64)
    slots = decoder.slots(cache)
    slot, _ = cache.acquire(prompt)
    decoder.prefill(prompt, slot, 0, 64, slots)
    cache.prefilled(slot, prompt)
    rows, path = plan_rows([(slot, len(prompt), VerifyTree.chain(chain[0], chain[1:]))])
    logits = decoder.forward(chain, rows, path, slots)
    picked = decoder.choices(chain, rows, path, slots)  # on AMX: lm_head in full (lmchoice.full_rows)
    assert picked.tolist() == lmchoice.first_max(logits).tolist()
    # the screen itself, in passes short enough for it on every path
    few = (lmchoice.full_rows(decoder._lib, decoder.isa) or len(chain) + 1) - 1
    kept = []
    for i in range(0, len(chain), few):
        part = chain[i : i + few]
        rows, path = plan_rows([(slot, len(prompt) + i, VerifyTree.chain(part[0], part[1:]))])
        assert decoder.choices(part, rows, path, slots).tolist() == lmchoice.first_max(logits[i : i + few]).tolist()
        kept.extend(decoder.kept[: len(part)])
    assert len(kept) == len(chain) and np.median(kept) < 50  # the screen leaves few tokens to compute exactly
