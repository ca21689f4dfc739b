"""The rowdecoder backend (forward/rows.py, kernels/rowdecoder.c): every row of a pass gets the bits
of the decode step it stands for, and the layers compute what transformers' do.

Tiny bf16 models run wherever the kernels build: their linear layers are put on
rowgemm even without AVX-512 BF16 (the scalar path, same layout), so the contract is
tested on any CPU; the real model's rows are pinned in test_real_model.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from codespec.settings import current
from codespec.forward import hf_weights, rowblocks, select
from codespec.forward import rowdecoder as rowdecoder_module
from codespec.forward.rows import plan_rows
from codespec.engine.engine import Engine, GenerationConfig
from codespec.errors import ModelError
from codespec.kernels import rowgemm
from codespec.engine.kvcache import SlotCache
from tests.tiny import tiny_model
from codespec.policy.proposer import PromptLookupProposer
from codespec.verify.tree import VerifyTree
from codespec.verify.verifier import Verifier
from codespec.forward.select import of_model
from tests.isa_paths import isa_params

def as_tensor(logits):
    """The row decoder's logits (bf16 bits) as a bf16 tensor."""
    return torch.from_numpy(logits).view(torch.bfloat16)


pytestmark = pytest.mark.skipif(rowgemm.library() is None, reason=f"no kernel build: {rowgemm.unavailable()}")

# heads of 64 dims (the kernel's smallest) and widths in whole 64-column stripes
SHAPE = dict(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, intermediate_size=192)


@pytest.fixture(autouse=True)
def linears_on_rowgemm(monkeypatch):
    monkeypatch.setattr(rowblocks, "linear_kernel", lambda dtype, device: "rowgemm")


def bf16_model(arch: str, vocab: int = 256, seed: int = 0, **overrides):
    model = tiny_model(arch, vocab_size=vocab, seed=seed, dtype=torch.bfloat16, **{**SHAPE, **overrides})
    rowblocks.install(model)
    return model


def random_ids(count: int, vocab: int, seed: int) -> list[int]:
    return torch.randint(0, vocab, (count,), generator=torch.Generator().manual_seed(seed)).tolist()


# every path of the C forward this CPU runs: its products and attention differ per path
ISA_CAPS = isa_params()


@pytest.mark.parametrize("isa_cap", ISA_CAPS)
@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_every_row_of_a_batched_tree_pass_equals_its_decode_step(arch, isa_cap):
    model = bf16_model(arch)
    cache = SlotCache(model.config, slots=4, slot_tokens=1100, dtype=torch.bfloat16, chunk=16)
    verifier = Verifier(hf_weights.row_forward(model, isa_cap=isa_cap), cache)
    assert verifier.forward.decoder.isa == isa_cap and verifier.row_block == 0
    rowdecoder = verifier.forward.decoder
    prompt, other = random_ids(1030, 256, 1), random_ids(40, 256, 2)  # past the first 1024 rotary positions
    tokens = (5, 6, 7, 8, 9, 10, 11, 12)  # main path 0-4, a branch off node 1 (5, 6), one off node 3 (7)
    tree = VerifyTree(tokens, (-1, 0, 1, 2, 3, 1, 5, 3), (0, 1, 2, 3, 4, 2, 3, 4), tuple(range(7)))
    side = VerifyTree.chain(other[-1], [3, 4, 5])
    main_slot, _ = cache.acquire(prompt)
    side_slot, _ = cache.acquire(other)
    verifier.prefill(main_slot, prompt[:-1])
    verifier.prefill(side_slot, other[:-1])
    requests = [(side_slot, cache.length(side_slot), side), (main_slot, cache.length(main_slot), tree)]
    rows, path = plan_rows(requests)
    logits = as_tensor(rowdecoder.forward([*side.tokens, *tree.tokens], rows, path, verifier.forward._slots(cache)))[len(side):]
    assert rowdecoder.positions > 1030
    for leaf in (4, 6, 7):
        slot, _ = cache.acquire([-1])
        verifier.prefill(slot, prompt[:-1])
        for node in tree.path(leaf):
            start = cache.length(slot)
            step_rows, step_path = plan_rows([(slot, start, VerifyTree.chain(tree.tokens[node]))])
            step = as_tensor(rowdecoder.forward([tree.tokens[node]], step_rows, step_path, verifier.forward._slots(cache)))
            assert torch.equal(logits[node], step[0]), f"{arch}: node {node} differs from its decode step"
            cache.committed(slot, [tree.tokens[node]])
        cache.release(slot)


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_the_layers_compute_what_transformers_computes(arch):
    """Not bit for bit (another attention summation order, another exp), but the same
    function: bf16 logits within bf16 noise of transformers' forward."""
    model = bf16_model(arch, seed=4)
    cache = SlotCache(model.config, slots=1, slot_tokens=256, dtype=torch.bfloat16)
    verifier = Verifier(of_model(model), cache)
    prompt = random_ids(60, 256, 3)
    slot, _ = cache.acquire(prompt)
    verifier.prefill(slot, prompt[:-1])
    draft = random_ids(6, 256, 4)
    rows, path = plan_rows([(slot, cache.length(slot), VerifyTree.chain(prompt[-1], draft))])
    ours = as_tensor(verifier.forward.decoder.forward([prompt[-1], *draft], rows, path, verifier.forward._slots(cache))).float()
    with torch.inference_mode():
        reference = model(input_ids=torch.tensor([prompt + draft])).logits[0, -len(draft) - 1 :].float()
    scale = reference.abs().max()
    assert (ours - reference).abs().max() < 0.03 * scale
    assert torch.equal(ours.argmax(-1)[:3], reference.argmax(-1)[:3])


@pytest.mark.parametrize("quantize", ["none", "int8"])
@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_speculative_output_equals_plain_output(arch, quantize):
    """Also with --quantize int8: every product and lm_head in int8 (kernels/int8.py),
    still row-exact, so speculation stays lossless against plain decoding with the same
    weights."""
    model = bf16_model(arch, vocab=16, seed=3)
    engine = Engine(of_model(model, quantize=quantize), None, PromptLookupProposer(min_match_tokens=1), max_draft_tokens=8, eos_token_ids=[])
    assert engine.verifier.forward.decoder is not None and engine.cost.min_rows == 1
    assert engine.verifier.forward.decoder.quantize == quantize and (engine.verifier.forward.decoder.screen is None) == (
        quantize == "int8")
    accepted = 0
    for seed in range(6):
        base = random_ids(3 + seed, 16, seed)
        prompt = base * 3
        plain = engine.generate(prompt, GenerationConfig(max_new_tokens=40, speculate=False))
        spec = engine.generate(prompt, GenerationConfig(max_new_tokens=40))
        assert spec.token_ids == plain.token_ids, f"prompt {prompt}"
        accepted += spec.stats.accepted_draft_tokens
    assert accepted > 20


def test_models_it_does_not_know_keep_transformers_forward(monkeypatch):
    narrow = bf16_model("qwen2", intermediate_size=200)  # the MLP's columns end mid-stripe
    assert "stripes" in hf_weights.unsupported(narrow)
    assert of_model(narrow).name == "transformers"
    gpt2 = SimpleNamespace(config=SimpleNamespace(model_type="gpt2"))
    assert "model type 'gpt2'" in hf_weights.unsupported_layers(gpt2)
    wide = bf16_model("qwen2")
    assert of_model(wide).name == "rowdecoder"
    forward, why = select._for_model(wide, "transformers", "none")  # CODESPEC_FORWARD=transformers
    assert forward.name == "transformers" and why == "CODESPEC_FORWARD=transformers"
    with pytest.raises(ModelError, match="--quantize int8 runs on the C row decoder"):
        select._for_model(narrow, "", "int8")
    monkeypatch.setenv("CODESPEC_FORWARD", "fast")
    with pytest.raises(ValueError, match="CODESPEC_FORWARD='fast'"):
        current()


def test_float_models_keep_transformers_forward(monkeypatch):
    monkeypatch.undo()  # the real linear-kernel choice: float64 stays on F.linear
    model = tiny_model("qwen2", vocab_size=16, **SHAPE)
    assert "linear kernel 'torch'" in hf_weights.unsupported(model)
    assert of_model(model).name == "transformers"


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_choices_are_the_argmax_of_the_pass_logits(arch, monkeypatch):
    """A greedy pass reads lm_head through its int8 screen (kernels/lmchoice.py): every row's
    choice is the argmax of the logits the full product gives that row, and the K/V it
    writes are the same."""
    from codespec.kernels import lmchoice

    model = bf16_model(arch, vocab=1000, seed=5)
    cache = SlotCache(model.config, slots=2, slot_tokens=256, dtype=torch.bfloat16, chunk=16)
    verifier = Verifier(of_model(model), cache)
    rowdecoder = verifier.forward.decoder
    assert rowdecoder.screen is not None
    prompt = random_ids(50, 1000, 6)
    tree = VerifyTree((5, 6, 7, 8, 9, 10), (-1, 0, 1, 2, 1, 4), (0, 1, 2, 3, 2, 3), ())
    for slot in (cache.acquire(prompt)[0], cache.acquire(prompt + [1])[0]):
        verifier.prefill(slot, prompt)
    rows, path = plan_rows([(0, cache.length(0), tree)])
    logits = rowdecoder.forward(list(tree.tokens), rows, path, verifier.forward._slots(cache))
    keys = [layer[0].clone() for layer in cache.keys]
    rows, path = plan_rows([(1, cache.length(1), tree), (0, cache.length(0), tree)])
    picked = rowdecoder.choices([*tree.tokens, *tree.tokens], rows, path, verifier.forward._slots(cache))
    expected = lmchoice.first_max(logits).tolist()
    assert picked.tolist() == expected * 2
    assert all(torch.equal(layer[0], kept) for layer, kept in zip(cache.keys, keys))
    monkeypatch.setenv("CODESPEC_LM_SCREEN", "off")
    assert hf_weights.new_decoder(model).screen is None


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_int8_computes_the_int8_model(arch):
    """The int8 row decoder's logits follow a float64 transformers model whose linear
    weights are the int8 ones (scale * q), within the bf16 forward's own noise, and
    closer than the bf16 row decoder follows it: it runs the model it claims to."""
    from tests.tiny import tiny_model

    source = tiny_model(arch, vocab_size=256, seed=7, dtype=torch.bfloat16, **SHAPE)
    reference = tiny_model(arch, vocab_size=256, seed=7, dtype=torch.float64, **SHAPE)
    weights = {name: value.double() for name, value in source.state_dict().items()}
    for name, value in weights.items():
        if value.dim() == 2 and "embed" not in name:  # every linear layer and lm_head
            step = value.float().abs().amax(1, keepdim=True) / 127
            weights[name] = ((value.float() / step).round().clamp(-127, 127) * step).double()
    reference.load_state_dict(weights)
    prompt = random_ids(40, 256, 8)
    with torch.inference_mode():
        expected = reference(input_ids=torch.tensor([prompt])).logits[0, -8:].float()
    errors = {}
    for quantize in ("int8", "none"):
        model = bf16_model(arch, seed=7)
        cache = SlotCache(model.config, slots=1, slot_tokens=128, dtype=torch.bfloat16, chunk=16)
        verifier = Verifier(of_model(model, quantize=quantize), cache)
        slot, _ = cache.acquire(prompt)
        verifier.prefill(slot, prompt[:-8])
        rows, path = plan_rows([(slot, cache.length(slot), VerifyTree.chain(prompt[-8], prompt[-7:]))])
        ours = as_tensor(verifier.forward.decoder.forward(prompt[-8:], rows, path, verifier.forward._slots(cache))).float()
        errors[quantize] = ((ours - expected).abs().mean() / expected.abs().mean()).item()
    assert errors["int8"] < 0.05 and errors["int8"] < 0.8 * errors["none"], errors


@pytest.mark.parametrize("isa_cap", ISA_CAPS)
def test_prefill_passes_of_any_size_write_the_same_kv_and_logits(isa_cap, monkeypatch):
    """rowdecoder.PREFILL_ROWS lets a path prefill in passes longer than the cache's
    chunk (AMX: 1,024 rows): the KV and the last row's logits are the same bits however
    the prompt is cut into passes."""
    model = bf16_model("qwen2", vocab=64, seed=5)
    prompt = random_ids(150, 64, 9)
    written = []
    for longest in (0, 48, 1024):  # the chunk's 16-row passes; 48-row passes; one pass
        monkeypatch.setattr(rowdecoder_module, "PREFILL_ROWS", {isa_cap: longest})
        cache = SlotCache(model.config, slots=1, slot_tokens=256, dtype=torch.bfloat16, chunk=16)
        verifier = Verifier(hf_weights.row_forward(model, isa_cap=isa_cap), cache)
        slot, _ = cache.acquire(prompt)
        logits = verifier.prefill(slot, prompt)
        kv = [layer[slot, :, :len(prompt)].clone() for layer in (*cache.keys, *cache.values)]
        written.append((logits.copy(), kv))
    for logits, kv in written[1:]:
        assert (logits == written[0][0]).all()
        assert all(torch.equal(a, b) for a, b in zip(kv, written[0][1]))


@pytest.mark.parametrize("isa_cap", ISA_CAPS)
def test_any_cached_prompt_prefix_is_reused_exactly(isa_cap):
    """A prefill row is a decode step's view, so a position's KV depends on the tokens up
    to it alone (Forward.prefill_exact): a prompt reuses every cached token it shares with
    an earlier one, wherever the prefill's passes were cut, and the output equals a fresh
    engine's, bit for bit (a person typing: six new tokens cost six, not a sub-chunk)."""
    model = bf16_model("qwen2", vocab=64, seed=4)

    def engine() -> Engine:
        forward = hf_weights.row_forward(model, isa_cap=isa_cap)
        assert forward.prefill_exact and forward.decoder.isa == isa_cap
        cache = SlotCache(model.config, slots=2, slot_tokens=256, dtype=torch.bfloat16, chunk=16)
        return Engine(forward, None, eos_token_ids=[], cache=cache)

    warm = engine()
    assert warm.cache.exact_prefix and warm.cache.spans(45, 37) == [(37, 45)]
    base = random_ids(90, 64, 8)
    cases = [base[:37], base[:43], base[:43] + [60, 60, 60], base[:80], [7] + base[:50]]
    reused = []
    for prompt in cases:
        config = GenerationConfig(max_new_tokens=10, speculate=False)
        out = warm.generate(prompt, config)
        assert out.token_ids == engine().generate(prompt, config).token_ids, f"prompt {prompt}"
        reused.append(out.stats.cached_prompt_tokens)
    # nothing; the first 37; the first 43; all of the longest earlier one (43 + its 3 new
    # tokens share only 43); a prompt that differs at its first token shares nothing
    assert reused == [0, 37, 43, 43, 0], reused
