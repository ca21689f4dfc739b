"""The cuda backend's fused layers (CODESPEC_CUDA_FUSED) with their products through the
Triton kernels under the interpreter: the contract between products (o and down leave
the residual stream's sums of squares, the next norm adds them; q/k/v's epilogue
rotates and stores K and V; gate/up's stores SiLU(gate) * up for down) keeps each row's
bits its own across layers, and the layers stay the model's. tests/test_cuda_forward.py checks the same layers through the
kernels' torch references."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from codespec.engine import Engine
from codespec.errors import SettingError
from codespec.forward import cuda
from codespec.forward.cuda import CudaForward
from codespec.kernels import row_linear as row_linear_module
from codespec.models.tiny import tiny_model
from codespec.policy.tree import VerifyTree
from tests.kernels.interpreter_patch import PADDING_ROW_WARNINGS
from tests.test_cuda_forward import assert_tree_rows_are_steps

pytest.importorskip("triton", reason="triton is a test dependency (pip install -e '.[test]')")
pytestmark = PADDING_ROW_WARNINGS


@pytest.fixture
def triton_products(monkeypatch):
    """row_linear runs its Triton kernels on CPU tensors (the interpreter)."""
    monkeypatch.setattr(row_linear_module, "use_triton", lambda tensor, force: True if force is None else force)


def pass_logits(monkeypatch, attention: str, reduce: str, setting: str, values: tuple[str, ...]):
    """A tree pass's logits through the Triton kernels (products and attention, under the
    interpreter) with `setting` at each of `values`, and the backend each built."""
    from codespec.kernels import lm_screen, row_attention

    for module in (row_linear_module, row_attention, lm_screen):
        monkeypatch.setattr(module, "use_triton", lambda tensor, force: True)
    monkeypatch.setenv("CODESPEC_CUDA_ATTENTION", attention)
    monkeypatch.setenv("CODESPEC_CUDA_REDUCE", reduce)
    model = tiny_model("qwen2", vocab_size=32, seed=11, dtype=torch.float32)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    tree = VerifyTree(tokens=(5, 6, 7), parents=(-1, 0, 0), depths=(0, 1, 1), draft_nodes=(0, 1))
    logits, forwards = {}, {}
    for value in values:
        monkeypatch.setenv(setting, value)
        forwards[value] = CudaForward(model, rows=16, fused=True)
        logits[value] = forwards[value].logits(prefilled(forwards[value], prompt), [(0, len(prompt), tree)])
    return logits, forwards


def prefilled(forward: CudaForward, prompt: list[int]):
    engine = Engine(forward, None, eos_token_ids=[], slots=2)
    for slot in (0, 1):
        engine.cache.acquire(prompt)
        forward.prefill(engine.cache, slot, prompt, 0)
    return engine.cache


@pytest.mark.parametrize("attention,reduce,prompt_len", [
    ("reference", "launch", 19), ("fold", "fold", 19),
    pytest.param("fold", "fold", 131, marks=pytest.mark.slow)])  # ~45 s: nine replays of the prefill
def test_a_fused_row_equals_its_decode_step_bit_for_bit(triton_products, monkeypatch, attention, reduce, prompt_len):
    """A tree row off the main chain gets the bits of the decode step that sees the same
    keys: the norm's sums of squares, the SiLU pairs and the splits depend on the row
    alone, layer after layer; with attention's fold schedule and the products' folded
    splits too (their Triton kernels, one counts buffer each for every layer). The fold
    over 131 keys: rows past the first key block combine two partials."""
    monkeypatch.setenv("CODESPEC_CUDA_REDUCE", reduce)
    if attention != "reference":
        from codespec.kernels import row_attention

        monkeypatch.setenv("CODESPEC_CUDA_ATTENTION", attention)
        monkeypatch.setattr(row_attention, "use_triton", lambda tensor, force: True)
    model = tiny_model("qwen2", vocab_size=32, seed=7, dtype=torch.float32)
    forward = CudaForward(model, rows=16, fused=True)
    prompt = [1 + i % 31 for i in range(prompt_len)]  # ids of the 32-token vocabulary
    assert_tree_rows_are_steps(forward, prefilled(forward, prompt), len(prompt))


def test_fused_layers_through_the_kernels_are_the_references_layers(monkeypatch):
    """The same pass through the Triton products and through their torch references
    (float32: equal up to the order of sums)."""
    model = tiny_model("qwen2", vocab_size=32, seed=9, dtype=torch.float32)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    tree = VerifyTree(tokens=(5, 6, 7), parents=(-1, 0, 1), depths=(0, 1, 2), draft_nodes=(0, 1))
    expected_forward = CudaForward(model, rows=16, fused=True)
    expected = expected_forward.logits(prefilled(expected_forward, prompt), [(0, len(prompt), tree)])
    monkeypatch.setattr(row_linear_module, "use_triton", lambda tensor, force: True)
    forward = CudaForward(model, rows=16, fused=True)
    got = forward.logits(prefilled(forward, prompt), [(0, len(prompt), tree)])
    assert torch.allclose(got, expected, rtol=1e-4, atol=1e-4)


def two_blocks_of_rows(monkeypatch):
    """16-row programs, folded splits; a tiny model, a prompt and a 20-row tree pass (two
    blocks of 16)."""
    monkeypatch.setenv("CODESPEC_CUDA_TILE_ROWS", "16")
    monkeypatch.setenv("CODESPEC_CUDA_REDUCE", "fold")
    model = tiny_model("qwen2", vocab_size=32, seed=7, dtype=torch.float32)
    tree = VerifyTree(tokens=tuple(range(3, 23)), parents=(-1, *range(19)), depths=tuple(range(20)),
                      draft_nodes=tuple(range(19)))
    return model, list(range(1, 20)), tree


@pytest.mark.parametrize("attention", ["worklist", "fold"])
def test_narrow_steps_keep_every_row_the_bits_of_the_full_bucket(triton_products, monkeypatch, attention):
    """CODESPEC_CUDA_NARROW_STEPS=1: a pass of up to tile_rows rows replays a
    graph of the bucket's first 16 rows alone (no blocks of padding rows), a wider one the
    whole bucket. A 3-row pass gets the full bucket's logits; a 20-row tree (the bucket's
    graph) its decode steps' bits (the narrow graph's); with early keys too (their bound,
    context - rows, at the narrow graph's 16). cuBLAS picks its kernels by the rows: the
    setting asks for the fused layers."""
    from codespec.kernels import row_attention

    monkeypatch.setattr(row_attention, "use_triton", lambda tensor, force: True)
    monkeypatch.setenv("CODESPEC_CUDA_ATTENTION", attention)
    model, prompt, tree = two_blocks_of_rows(monkeypatch)
    short = VerifyTree(tokens=(5, 6, 7), parents=(-1, 0, 0), depths=(0, 1, 1), draft_nodes=(0, 1))
    plain = CudaForward(model, rows=64, fused=True)
    expected = plain.logits(prefilled(plain, prompt), [(0, len(prompt), short)])
    monkeypatch.setenv("CODESPEC_CUDA_NARROW_STEPS", "1")
    for early in ("0", "1"):
        monkeypatch.setenv("CODESPEC_CUDA_EARLY_KEYS", early)
        forward = CudaForward(model, rows=64, fused=True)
        assert forward.warm_up_rows == (1, 17) and forward.profile_key()["layout"] != plain.profile_key()["layout"]
        cache = prefilled(forward, prompt)
        seen: list[Any] = []
        replay = forward._replay
        monkeypatch.setattr(forward, "_replay", lambda cache, bucket, layout=None, replay=replay, seen=seen:
                            seen.append(layout) or replay(cache, bucket, layout))
        got = forward.logits(cache, [(0, len(prompt), short)])
        assert seen == [cuda.NARROW] and (early == "1" or torch.equal(got, expected))
        tree_logits = forward.logits(cache, [(0, len(prompt), tree)])
        steps = [forward.logits(cache, [(1, len(prompt) + i, VerifyTree.chain(3 + i))])[0] for i in range(3)]
        assert seen == [cuda.NARROW, None, cuda.NARROW, cuda.NARROW, cuda.NARROW]
        assert all(torch.equal(tree_logits[i], steps[i]) for i in range(3)), early
    with pytest.raises(SettingError, match="CODESPEC_CUDA_NARROW_STEPS computes fewer rows with the fused products"):
        CudaForward(model, rows=64, fused=False)


def test_a_row_group_keeps_every_row_its_decode_steps_and_a_group_of_ones_bits(triton_products, monkeypatch):
    """CODESPEC_CUDA_ROW_GROUP=4: the fused products compute a 64-row bucket's four blocks
    of 16 rows in one program each, each weight tile loaded once: a tree row still equals
    its decode step, and a pass's logits are those of one block a program, bit for bit."""
    model, prompt, tree = two_blocks_of_rows(monkeypatch)
    logits = {}
    for group in ("1", "4"):
        monkeypatch.setenv("CODESPEC_CUDA_ROW_GROUP", group)
        forward = CudaForward(model, rows=64, fused=True)
        assert {tile.row_group for tile in forward.tiles.values()} == {int(group)}
        logits[group] = forward.logits(prefilled(forward, prompt), [(0, len(prompt), tree)])
    assert torch.equal(logits["1"], logits["4"])
    assert_tree_rows_are_steps(forward, prefilled(forward, prompt), len(prompt))


def test_passes_of_grouped_rows_keep_every_row_its_decode_steps(triton_products, monkeypatch):
    """CODESPEC_CUDA_PASS_ROW_GROUP=4: a pass wider than a block of 16 rows
    replays a second graph whose products compute the bucket's four blocks with each
    weight tile, while steps keep the group of one's: its tree rows still have their
    decode steps' bits, and its logits are those of a pass in the steps' layout. A pass
    of one block takes the steps' graph."""
    model, prompt, tree = two_blocks_of_rows(monkeypatch)
    plain = CudaForward(model, rows=64, fused=True)
    expected = plain.logits(prefilled(plain, prompt), [(0, len(prompt), tree)])
    monkeypatch.setenv("CODESPEC_CUDA_PASS_ROW_GROUP", "4")
    forward = CudaForward(model, rows=64, fused=True)
    assert {tile.row_group for tile in forward.tiles.values()} == {1}
    assert {tile.row_group for tile in forward.pass_tiles.values()} == {4}
    assert forward.profile_key()["layout"] != plain.profile_key()["layout"]
    cache = prefilled(forward, prompt)
    seen: list[Any] = []
    replay = forward._replay
    monkeypatch.setattr(forward, "_replay", lambda cache, bucket, layout=None: seen.append(layout) or
                        replay(cache, bucket, layout))
    assert torch.equal(forward.logits(cache, [(0, len(prompt), tree)]), expected)
    assert seen == [cuda.WIDE]
    steps = [forward.logits(cache, [(1, len(prompt) + i, VerifyTree.chain(3 + i))])[0] for i in range(3)]
    assert seen == [cuda.WIDE, None, None, None]
    tree_logits = forward.logits(cache, [(0, len(prompt), tree)])
    assert all(torch.equal(tree_logits[i], steps[i]) for i in range(3))
    monkeypatch.setenv("CODESPEC_CUDA_FUSED", "0")
    with pytest.raises(SettingError, match="CODESPEC_CUDA_PASS_ROW_GROUP groups the fused products' rows"):
        CudaForward(model, rows=64)


@pytest.mark.parametrize("attention,reduce", [("worklist", "launch"), ("fold", "fold")])
def test_launches_that_wait_on_counts_compute_the_same_bits_and_count_every_program(monkeypatch, attention, reduce):
    """CODESPEC_CUDA_PDL=flags (kernels/flags.py): every launch of the fused layers (the
    embeddings, the products and their reduce and choices launches, attention and its
    combine) waits on the launch before's count, then raises its own after its stores.
    Under the interpreter launches run in turn, so every count is met: the same logits
    as without, bit for bit, every launch's count its programs, no wait given up."""
    logits, forwards = pass_logits(monkeypatch, attention, reduce, "CODESPEC_CUDA_PDL", ("off", "flags"))
    assert torch.equal(logits["off"], logits["flags"])
    flags = forwards["flags"].flags
    model = forwards["flags"].model
    counts, launches = flags.counts.tolist(), len(flags.programs)
    # the embeddings, per layer at least q/k/v, attention, o, gate/up and down, then lm_head and its choices
    assert launches >= 1 + 5 * model.config.num_hidden_layers + 2
    assert counts[1:launches + 1] == flags.programs and counts[0] == 0 and not any(counts[launches + 1:])
    assert flags.programs[0] == 16 and flags.errors() == 0  # the embeddings: a program a row of the bucket


def test_lm_head_s_screen_waits_on_counts_too(monkeypatch):
    """CODESPEC_CUDA_LM_SCREEN=1 with CODESPEC_CUDA_PDL=flags: the screen's launches (the
    normed rows, the screen, the screened product, its choices) wait on the count before
    and raise their own, the same bits as without."""
    monkeypatch.setenv("CODESPEC_CUDA_LM_SCREEN", "1")
    logits, forwards = pass_logits(monkeypatch, "fold", "fold", "CODESPEC_CUDA_PDL", ("off", "flags"))
    assert torch.equal(logits["off"], logits["flags"]) and forwards["flags"].screen is not None
    flags = forwards["flags"].flags
    launches = len(flags.programs)
    assert flags.counts.tolist()[1:launches + 1] == flags.programs and flags.errors() == 0
    # a program a row of the bucket for the norm and the choices; one block of the
    # vocabulary of 32 for the screen and the product
    assert flags.programs[-4:] == [16, 1, 1, 16]


@pytest.mark.parametrize("setting", ["CODESPEC_CUDA_EARLY_ROWS", "CODESPEC_CUDA_EARLY_KEYS"])
def test_reads_moved_before_the_wait_give_the_fused_layers_same_logits(monkeypatch, setting):
    """The plain bar's candidates move reads before the wait for the kernel before: the
    products' live rows, attention's first block. Under the interpreter (every launch in
    turn) a tree pass's logits are the bits without them, and the backend took them."""
    logits, forwards = pass_logits(monkeypatch, "fold", "fold", setting, ("0", "1"))
    assert torch.equal(logits["0"], logits["1"])
    name = setting.removeprefix("CODESPEC_CUDA_").lower()
    assert getattr(forwards["1"], name) and not getattr(forwards["0"], name)


def test_attention_rows_in_groups_give_the_fused_layers_same_logits(monkeypatch):
    """CODESPEC_CUDA_ATTENTION_ROWS=4: a tree pass's rows in groups of four, their
    shared context blocks loaded once a group; under the interpreter the five-launch
    layers' logits are the bits of one row an item. Refused with early keys, the grid,
    and the fold at 64-key blocks."""
    logits, forwards = pass_logits(monkeypatch, "fold", "fold", "CODESPEC_CUDA_ATTENTION_ROWS", ("1", "4"))
    assert torch.equal(logits["1"], logits["4"]) and forwards["4"].attention_rows == 4
    assert forwards["4"].profile_key()["layout"] != forwards["1"].profile_key()["layout"]
    model = forwards["4"].model
    for setting, value in (("CODESPEC_CUDA_EARLY_KEYS", "1"), ("CODESPEC_CUDA_ATTENTION", "grid"),
                           ("CODESPEC_CUDA_KEY_BLOCK", "64")):
        monkeypatch.setenv("CODESPEC_CUDA_ATTENTION", "fold")
        monkeypatch.setenv(setting, value)
        with pytest.raises(SettingError, match="CODESPEC_CUDA_ATTENTION_ROWS groups"):
            CudaForward(model, rows=16, fused=True)
        monkeypatch.delenv(setting)
    monkeypatch.setenv("CODESPEC_CUDA_ATTENTION", "worklist")
    monkeypatch.setenv("CODESPEC_CUDA_KEY_BLOCK", "64")  # the worklist groups 64-key blocks too
    assert CudaForward(model, rows=16, fused=True).attention_rows == 4


@pytest.mark.slow  # ~1 min: a 140-token prompt's replays through the interpreter
def test_attention_rows_in_groups_keep_a_tree_row_its_decode_steps_bits(triton_products, monkeypatch):
    """CODESPEC_CUDA_ATTENTION_ROWS=2 over a context past one 128-key block: the tree's rows
    share that block in groups of two, a decode step (a group of one row) loads it alone;
    each tree row still gets its decode step's bits."""
    from codespec.kernels import row_attention

    monkeypatch.setattr(row_attention, "use_triton", lambda tensor, force: True)
    monkeypatch.setenv("CODESPEC_CUDA_ATTENTION", "fold")
    monkeypatch.setenv("CODESPEC_CUDA_REDUCE", "fold")
    monkeypatch.setenv("CODESPEC_CUDA_ATTENTION_ROWS", "2")
    model = tiny_model("qwen2", vocab_size=32, seed=7, dtype=torch.float32)
    forward = CudaForward(model, rows=16, fused=True)
    prompt = [1 + i % 31 for i in range(140)]
    assert forward.attention_rows == 2
    assert_tree_rows_are_steps(forward, prefilled(forward, prompt), len(prompt))


def test_counted_launches_ask_for_the_fused_layers(monkeypatch):
    monkeypatch.setenv("CODESPEC_CUDA_PDL", "flags")
    model = tiny_model("qwen2", vocab_size=32, seed=13, dtype=torch.float32)
    with pytest.raises(SettingError, match="CODESPEC_CUDA_FUSED=1"):
        CudaForward(model, rows=16, fused=False)


@pytest.mark.parametrize("setting,value,argument,passed", [("KEY_BLOCK", "64", "key_block", 64),
                                                          ("EARLY_KEYS", "1", "early", True),
                                                          ("ATTENTION_ROWS", "2", "item_rows", 2)])
@pytest.mark.parametrize("schedule", ["worklist", "fold"])
def test_attention_launches_take_the_backends_key_block_and_rows_stay_steps(monkeypatch, schedule, setting, value,
                                                                          argument, passed):
    """CODESPEC_CUDA_KEY_BLOCK=64 and CODESPEC_CUDA_EARLY_KEYS=1 reach every
    attention launch (the Triton kernel under the interpreter), and a tree row over 70
    keys (two 64-key blocks; with early keys, some below context - rows of an 8-row
    bucket, some above) still gets its decode step's bits."""
    from codespec.kernels import row_attention

    seen = []

    def recorded(*args, **kwargs):
        seen.append(kwargs[argument])
        return row_attention.row_attention(*args, **kwargs)

    monkeypatch.setenv(f"CODESPEC_CUDA_{setting}", value)
    monkeypatch.setenv("CODESPEC_CUDA_ATTENTION", schedule)
    monkeypatch.setattr(row_attention, "use_triton", lambda tensor, force: True)
    monkeypatch.setattr(cuda, "row_attention", recorded)
    model = tiny_model("qwen2", vocab_size=32, seed=7, dtype=torch.float32)
    forward = CudaForward(model, rows=8)
    prompt = [1 + i % 31 for i in range(67)]
    assert_tree_rows_are_steps(forward, prefilled(forward, prompt), len(prompt))
    assert seen and set(seen) == {passed}


def test_lm_head_behind_its_screen_keeps_every_choice_and_row(triton_products, monkeypatch):
    """CODESPEC_CUDA_LM_SCREEN=1 (kernels/lm_screen.py): the normed rows, the
    screen, the flagged blocks and the choices, four Triton launches under the
    interpreter. A tree row's logits (the full product over its normed row, outside the
    graph) are its decode steps' bits; every pass's choices are the argmax of those
    logits and the choices without the screen, with padding rows, a 20-row tree over two
    blocks of 16 rows. (Speculation through it: tests/test_cuda_forward.py.)"""
    from codespec.kernels import lm_screen

    monkeypatch.setattr(lm_screen, "use_triton", lambda tensor, force: True)
    model, prompt, tree = two_blocks_of_rows(monkeypatch)
    plain = CudaForward(model, rows=32, fused=True)
    monkeypatch.setenv("CODESPEC_CUDA_LM_SCREEN", "1")
    forward = CudaForward(model, rows=32, fused=True, trace=True)
    assert forward.screen is not None and plain.screen is None
    assert forward.profile_key()["layout"] != plain.profile_key()["layout"]
    cache, plain_cache = prefilled(forward, prompt), prefilled(plain, prompt)
    # a prefill's last row: the full product over that row alone, outside the graph
    first, plain_first = forward.prefill(cache, 1, prompt, 0), plain.prefill(plain_cache, 1, prompt, 0)
    assert first.shape == (1, 32) and torch.allclose(first, plain_first, rtol=1e-4, atol=1e-4)
    assert_tree_rows_are_steps(forward, cache, len(prompt))
    # traced: lm_head's launches (the choices' is not), a program a row for the norm, one
    # for the screen (its 32 rows' two blocks of 16 in a group, the vocabulary one block of
    # 32), one a block of 16 rows for the product
    launches = forward.tracer.timeline()["launches"]
    assert [(launch["label"], launch["programs"]) for launch in launches[-3:]] == [
        ("lm_norm", 32), ("lm_screen", 1), ("lm_head", 2)]
    for requests in ([(0, len(prompt), tree)], [(0, len(prompt), VerifyTree.chain(4)), (1, len(prompt), tree)]):
        logits = forward.logits(cache, requests)
        choices = forward.choices(cache, requests)
        assert choices == logits.argmax(dim=1).tolist() == plain.choices(plain_cache, requests)
        assert torch.allclose(logits, plain.logits(plain_cache, requests), rtol=1e-4, atol=1e-4)


def test_lm_head_s_screen_asks_for_what_its_bound_needs(monkeypatch):
    monkeypatch.setenv("CODESPEC_CUDA_LM_SCREEN", "1")
    model = tiny_model("qwen2", vocab_size=32, seed=13, dtype=torch.float32)
    with pytest.raises(SettingError, match="CODESPEC_CUDA_FUSED=1"):
        CudaForward(model, rows=16, fused=False)
    model.lm_head.bias = torch.nn.Parameter(torch.zeros(32))
    with pytest.raises(SettingError, match="without bias"):
        CudaForward(model, rows=16, fused=True)
