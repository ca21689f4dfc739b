"""The row-exact attention kernel (forward/cuda/attention.py) under the Triton interpreter:
equal to its reference, and a row's bits depend on its logical keys alone."""

from __future__ import annotations

import random

import pytest
import torch

from codespec.forward.cuda import attention as module
from codespec.forward.cuda.attention import KEY_BLOCK, row_attention, row_attention_ref

pytest.importorskip("triton", reason="triton is a test dependency (pip install -e '.[test]')")

HEADS, KV_HEADS, DIM = 14, 2, 64  # the default model's layout: 7 query heads per KV head


def random_rows(rng: random.Random, rows: int, slots: int, positions: int) -> dict[str, torch.Tensor]:
    """Rows over random slots: a context (sometimes crossing a KEY_BLOCK edge), a path
    of scattered positions after it (sometimes none), and a padding row with no keys."""
    width = 6
    meta = {"slots": [], "context": [], "path": [], "path_len": []}
    for r in range(rows):
        context = 0 if r == rows - 1 else rng.choice([1, KEY_BLOCK - 1, KEY_BLOCK + 3, rng.randrange(1, 150)])
        tail = [] if r == rows - 1 else sorted(rng.sample(range(context, positions), rng.randint(0, width)))
        meta["slots"].append(rng.randrange(slots))
        meta["context"].append(context)
        meta["path"].append(tail + [0] * (width - len(tail)))
        meta["path_len"].append(len(tail))
    return {name: torch.tensor(values) for name, values in meta.items()}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_matches_reference(dtype):
    rng = random.Random(1)
    keys, values = (torch.randn(3, KV_HEADS, 200, DIM).to(dtype) for _ in range(2))
    query = torch.randn(6, HEADS, DIM).to(dtype)
    rows = random_rows(rng, 6, 3, 200)
    got = row_attention(query, keys, values, **rows, scale=DIM ** -0.5, force_triton=True)
    expected = row_attention_ref(query, keys, values, *rows.values(), DIM ** -0.5)
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2  # bf16: the output's own rounding
    assert torch.allclose(got.float(), expected.float(), atol=tolerance, rtol=tolerance)
    assert torch.count_nonzero(got[-1]) == 0  # the padding row: no keys, zeros


def test_a_rows_bits_depend_on_its_keys_alone():
    """The same query over the same keys gets the same bits: alone or among other rows,
    and with its keys scattered along a tree path or contiguous after decoding (two key
    blocks: the combine's order is in them too)."""
    torch.manual_seed(2)
    context, tail = 200, [205, 207, 213]
    keys, values = (torch.randn(2, KV_HEADS, 256, DIM, dtype=torch.bfloat16) for _ in range(2))
    for store in (keys, values):  # slot 1 holds slot 0's logical keys contiguously
        store[1, :, :context] = store[0, :, :context]
        store[1, :, context:context + len(tail)] = store[0, :, tail]
    query = torch.randn(5, HEADS, DIM, dtype=torch.bfloat16)

    def run(rows, slots, contexts, paths):
        width = max(len(p) for p in paths) or 1
        meta = dict(slots=torch.tensor(slots), context=torch.tensor(contexts),
                    path=torch.tensor([p + [0] * (width - len(p)) for p in paths]),
                    path_len=torch.tensor([len(p) for p in paths]))
        return row_attention(query[rows], keys, values, **meta, scale=0.125, force_triton=True)

    in_a_pass = run([0, 1, 2, 3, 4], [0, 1, 0, 1, 0], [context, 40, 7, 250, 0], [tail, [], [8, 9], [], []])[0]
    alone = run([0], [0], [context], [tail])[0]
    decoded = run([0], [1], [context + len(tail)], [[]])[0]  # the decode step after the path was kept
    assert torch.equal(in_a_pass, alone) and torch.equal(alone, decoded)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_long_rows_split_into_blocks_any_wave_gives_the_same_bits(dtype, monkeypatch):
    """Rows of more blocks than a combine chunk, paths and padding: equal to the
    reference, and the bits do not depend on how many programs share the pass's items
    (a launch detail, not part of the arithmetic)."""
    torch.manual_seed(4)
    positions = KEY_BLOCK * 18 + 40
    keys, values = (torch.randn(1, KV_HEADS, positions, DIM).to(dtype) for _ in range(2))
    query = torch.randn(3, HEADS, DIM).to(dtype)
    meta = dict(slots=torch.tensor([0, 0, 0]), context=torch.tensor([positions - 3, KEY_BLOCK * 17, 5]),
                path=torch.tensor([[positions - 2, positions - 1], [positions - 9, 0], [0, 0]]),
                path_len=torch.tensor([2, 1, 0]))
    results = []
    for programs in (1, 3, 50):  # one program takes every item, or many idle
        monkeypatch.setattr(module, "wave", lambda device, n=programs: n)
        results.append(row_attention(query, keys, values, **meta, scale=0.125, force_triton=True))
    expected = row_attention_ref(query, keys, values, *meta.values(), 0.125)
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2
    assert torch.allclose(results[0].float(), expected.float(), atol=tolerance, rtol=tolerance)
    assert all(torch.equal(result, results[0]) for result in results)


def test_bad_arguments_are_refused():
    query = torch.randn(2, HEADS, DIM)
    keys = torch.randn(1, KV_HEADS, 8, DIM)
    good = dict(slots=torch.tensor([0, 0]), context=torch.tensor([1, 2]), path=torch.zeros(2, 1, dtype=torch.int64),
                path_len=torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="multiple of kv_heads"):
        row_attention(torch.randn(2, 3, DIM), keys, keys, **good, scale=1.0)
    with pytest.raises(ValueError, match=r"\[rows\]"):
        row_attention(query, keys, keys, **{**good, "context": torch.tensor([1])}, scale=1.0)
