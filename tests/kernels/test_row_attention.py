"""The row-exact attention kernel (kernels/row_attention.py) under the Triton interpreter:
equal to its reference, and a row's bits depend on its logical keys alone."""

from __future__ import annotations

import random

import pytest
import torch

from codespec.kernels import row_attention as module
from codespec.kernels.row_attention import KEY_BLOCK, row_attention, row_attention_ref

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


@pytest.mark.parametrize("key_block", [None, 64])
@pytest.mark.parametrize("schedule", ["worklist", "fold"])
def test_a_rows_bits_depend_on_its_keys_alone(schedule, key_block):
    """The same query over the same keys gets the same bits: alone or among other rows,
    and with its keys scattered along a tree path or contiguous after decoding (two key
    blocks of 128, four of 64: the combine's order is in them too)."""
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
        return row_attention(query[rows], keys, values, **meta, scale=0.125, force_triton=True, schedule=schedule,
                             counts=torch.zeros(64, dtype=torch.int32), key_block=key_block)

    in_a_pass = run([0, 1, 2, 3, 4], [0, 1, 0, 1, 0], [context, 40, 7, 250, 0], [tail, [], [8, 9], [], []])[0]
    alone = run([0], [0], [context], [tail])[0]
    decoded = run([0], [1], [context + len(tail)], [[]])[0]  # the decode step after the path was kept
    assert torch.equal(in_a_pass, alone) and torch.equal(alone, decoded)


def test_long_rows_split_into_blocks_any_launch_gives_the_same_bits(monkeypatch):
    """Rows of more blocks than programs per row (each program takes several) and more
    than one combine chunk: equal to the reference, and the bits do not depend on how
    many programs share a row's blocks (a launch detail, not part of the arithmetic)."""
    torch.manual_seed(4)
    positions = KEY_BLOCK * 18 + 40
    keys, values = (torch.randn(1, KV_HEADS, positions, DIM, dtype=torch.bfloat16) for _ in range(2))
    query = torch.randn(3, HEADS, DIM, dtype=torch.bfloat16)
    meta = dict(slots=torch.tensor([0, 0, 0]), context=torch.tensor([positions - 3, KEY_BLOCK * 17, 5]),
                path=torch.tensor([[positions - 2, positions - 1], [positions - 9, 0], [0, 0]]),
                path_len=torch.tensor([2, 1, 0]))
    wide = row_attention(query, keys, values, **meta, scale=0.125, force_triton=True, schedule="grid")
    expected = row_attention_ref(query, keys, values, *meta.values(), 0.125)
    assert torch.allclose(wide.float(), expected.float(), atol=1e-2, rtol=1e-2)
    monkeypatch.setattr(module, "BLOCK_PROGRAMS", 3)
    assert torch.equal(row_attention(query, keys, values, **meta, scale=0.125, force_triton=True, schedule="grid"),
                       wide)
    for programs in (1, 3, 50):  # the worklist's wave: one program takes every item, or many idle
        monkeypatch.setattr(module, "wave", lambda device, n=programs: n)
        assert torch.equal(row_attention(query, keys, values, **meta, scale=0.125, force_triton=True,
                                         schedule="worklist"), wide)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_both_schedules_give_the_same_bits(dtype, monkeypatch):
    """The worklist and the grid run the same code for every (row, block, KV head) and
    combine: a pass of rows over several blocks, paths and padding gets the same bits
    from both, at either warps' layout of the combine."""
    rng = random.Random(7)
    keys, values = (torch.randn(4, KV_HEADS, 420, DIM).to(dtype) for _ in range(2))
    rows = random_rows(rng, 13, 4, 420)
    rows["context"][3], rows["context"][5] = 3 * KEY_BLOCK + 1, 2 * KEY_BLOCK  # rows of several blocks
    query = torch.randn(13, HEADS, DIM).to(dtype)
    monkeypatch.setattr(module, "wave", lambda device: 5)
    for warps in (4, 8):
        monkeypatch.setattr(module, "WORK_WARPS", warps)
        grid = row_attention(query, keys, values, **rows, scale=0.125, force_triton=True, schedule="grid")
        assert torch.equal(row_attention(query, keys, values, **rows, scale=0.125, force_triton=True,
                                         schedule="worklist"), grid), warps
    with pytest.raises(ValueError, match="attention schedule 'tiles'"):
        row_attention(query, keys, values, **rows, scale=0.125, force_triton=True, schedule="tiles")


def test_bad_arguments_are_refused():
    query = torch.randn(2, HEADS, DIM)
    keys = torch.randn(1, KV_HEADS, 8, DIM)
    good = dict(slots=torch.tensor([0, 0]), context=torch.tensor([1, 2]), path=torch.zeros(2, 1, dtype=torch.int64),
                path_len=torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="multiple of kv_heads"):
        row_attention(torch.randn(2, 3, DIM), keys, keys, **good, scale=1.0)
    with pytest.raises(ValueError, match=r"\[rows\]"):
        row_attention(query, keys, keys, **{**good, "context": torch.tensor([1])}, scale=1.0)


def fold(query, keys, values, rows, counts=None, **kwargs):
    counts = torch.zeros(64, dtype=torch.int32) if counts is None else counts
    return row_attention(query, keys, values, **rows, scale=0.125, force_triton=True, schedule="fold", counts=counts,
                         **kwargs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_fold_schedule_matches_the_reference_and_leaves_its_counts_zero(dtype, monkeypatch):
    """`fold`: the combine by the program that stores a (row, KV head)'s last block, all
    its query heads at once; rows of several blocks and of more blocks than a combine step
    (fold_chunk: 8 of 128 keys), paths, a padding row (zeros). Any wave gives the same bits, and the
    counts are zero after every launch (one buffer, launched again)."""
    rng = random.Random(9)
    positions = KEY_BLOCK * 10 + 20
    keys, values = (torch.randn(3, KV_HEADS, positions, DIM).to(dtype) for _ in range(2))
    rows = random_rows(rng, 7, 3, positions)
    rows["context"][1], rows["context"][2] = KEY_BLOCK * 9 + 5, 2 * KEY_BLOCK  # 10 blocks: two combine steps
    query = torch.randn(7, HEADS, DIM).to(dtype)
    counts = torch.zeros(64, dtype=torch.int32)
    expected = row_attention_ref(query, keys, values, *rows.values(), 0.125)
    results = []
    for programs in (1, 3, 50):
        monkeypatch.setattr(module, "wave", lambda device, n=programs: n)
        results.append(fold(query, keys, values, rows, counts))
        assert not counts.any(), programs
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2
    assert torch.allclose(results[0].float(), expected.float(), atol=tolerance, rtol=tolerance)
    assert all(torch.equal(result, results[0]) for result in results)
    assert torch.count_nonzero(results[0][-1]) == 0  # the padding row


@pytest.mark.parametrize("schedule", ["worklist", "fold"])
def test_64_key_blocks_match_the_reference(schedule, monkeypatch):
    """CODESPEC_CUDA_KEY_BLOCK=64: rows of one to eighteen 64-key blocks (a
    fold's combine takes 16 a step: ten in one, eighteen in two), paths and a padding row,
    equal to the reference; any wave gives the same bits, and the fold leaves its counts
    zero."""
    rng = random.Random(21)
    positions = 64 * 18 + 20
    keys, values = (torch.randn(3, KV_HEADS, positions, DIM) for _ in range(2))
    rows = random_rows(rng, 7, 3, positions)
    rows["context"][1], rows["context"][2], rows["context"][3] = 64 * 17 + 5, 64 * 9 + 5, 64 * 2  # 18, 10, 2
    query = torch.randn(7, HEADS, DIM)
    counts = torch.zeros(64, dtype=torch.int32)
    expected = row_attention_ref(query, keys, values, *rows.values(), 0.125)
    results = []
    for programs in (1, 3, 50):
        monkeypatch.setattr(module, "wave", lambda device, n=programs: n)
        results.append(row_attention(query, keys, values, **rows, scale=0.125, force_triton=True, schedule=schedule,
                                     counts=counts, key_block=64))
        assert not counts.any(), programs
    assert torch.allclose(results[0], expected, atol=1e-5, rtol=1e-5)
    assert all(torch.equal(result, results[0]) for result in results)
    assert torch.count_nonzero(results[0][-1]) == 0  # the padding row


def test_the_fold_schedule_needs_its_counts():
    query, keys = torch.randn(2, HEADS, DIM), torch.randn(1, KV_HEADS, 8, DIM)
    rows = dict(slots=torch.tensor([0, 0]), context=torch.tensor([1, 2]), path=torch.zeros(2, 1, dtype=torch.int64),
                path_len=torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="fold schedule needs counts"):
        row_attention(query, keys, keys, **rows, scale=1.0, force_triton=True, schedule="fold")
    with pytest.raises(ValueError, match="fold schedule needs counts"):
        fold(query, keys, keys, rows, counts=torch.zeros(3, dtype=torch.int32))  # 2 rows x 2 KV heads
    with pytest.raises(ValueError, match="attention schedule 'walk': expected one of worklist, grid, fold"):
        row_attention(query, keys, keys, **rows, scale=1.0, force_triton=True, schedule="walk")  # removed: it lost on an H200


@pytest.mark.parametrize("key_block", [None, 64])
@pytest.mark.parametrize("schedule", ["worklist", "fold"])
def test_early_keys_give_the_same_bits(schedule, key_block, monkeypatch):
    """`early` (CODESPEC_CUDA_EARLY_KEYS): a program's first item loaded before
    its wait in two parts, the context's keys below context - rows, then the rest. Rows
    whose blocks lie wholly below that bound, cross it, or lie above it (a short context,
    a path, a padding row), in waves with items per program of several, one and none:
    every result the bits of the launch without it, and the fold's counts left zero."""
    rng = random.Random(41)
    positions = 700
    keys, values = (torch.randn(3, KV_HEADS, positions, DIM, dtype=torch.bfloat16) for _ in range(2))
    rows = random_rows(rng, 7, 3, positions)
    # rows = 7: with 128-key blocks, row 0's first four blocks lie below 600 - 7, its fifth
    # crosses it; row 1's one block crosses it; row 2 has a path after 300 keys
    rows["context"][0], rows["context"][1], rows["context"][2] = 600, 100, 300
    query = torch.randn(7, HEADS, DIM, dtype=torch.bfloat16)
    counts = torch.zeros(64, dtype=torch.int32)
    for programs in (1, 3, 50):
        monkeypatch.setattr(module, "wave", lambda device, n=programs: n)
        plain, early = (row_attention(query, keys, values, **rows, scale=0.125, force_triton=True, schedule=schedule,
                                      counts=counts, key_block=key_block, early=flag) for flag in (False, True))
        assert torch.equal(early, plain), programs
        assert not counts.any(), programs
    expected = row_attention_ref(query, keys, values, *rows.values(), 0.125)
    assert torch.allclose(early.float(), expected.float(), atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("item_rows", [2, 4])
@pytest.mark.parametrize("schedule", ["worklist", "fold"])
def test_rows_in_groups_give_the_same_bits(schedule, item_rows, monkeypatch):
    """`item_rows` (CODESPEC_CUDA_ATTENTION_ROWS): rows in groups of consecutive
    ones, a group's blocks wholly in each of its rows' context (all of one slot) loaded
    once and each row's partial computed from them. A verify pass's rows (one slot, a long
    shared context, then paths), a group of two slots, short contexts and a padding row,
    in waves of one to fifty programs, 128-key blocks and (the worklist) 64: every result
    the bits of one row an item, and the fold's counts left zero. At 64-key blocks the
    fold refuses it (its combine spills beside it on sm_90)."""
    rng = random.Random(42)
    positions = 700
    keys, values = (torch.randn(3, KV_HEADS, positions, DIM, dtype=torch.bfloat16) for _ in range(2))
    rows = random_rows(rng, 11, 3, positions)
    for r in range(6):  # a request's rows in slot 1: the context up to 300, then its paths
        rows["slots"][r], rows["context"][r] = 1, 300 + r
    rows["slots"][6], rows["slots"][7] = 0, 1  # a group (with four rows) of two slots
    query = torch.randn(11, HEADS, DIM, dtype=torch.bfloat16)
    counts = torch.zeros(64, dtype=torch.int32)
    for key_block in (None, 64) if schedule == "worklist" else (None,):
        for programs in (1, 3, 50):
            monkeypatch.setattr(module, "wave", lambda device, n=programs: n)
            one, grouped = (row_attention(query, keys, values, **rows, scale=0.125, force_triton=True,
                                          schedule=schedule, counts=counts, key_block=key_block, item_rows=n)
                            for n in (1, item_rows))
            assert torch.equal(grouped, one), (key_block, programs)
            assert not counts.any(), (key_block, programs)
    expected = row_attention_ref(query, keys, values, *rows.values(), 0.125)
    assert torch.allclose(grouped.float(), expected.float(), atol=1e-2, rtol=1e-2)
    with pytest.raises(ValueError, match="not with early keys"):
        row_attention(query, keys, values, **rows, scale=0.125, force_triton=True, schedule=schedule, counts=counts,
                      early=True, item_rows=item_rows)
    if schedule == "fold":
        with pytest.raises(ValueError, match="fold 128-key blocks alone"):
            row_attention(query, keys, values, **rows, scale=0.125, force_triton=True, schedule=schedule,
                          counts=counts, key_block=64, item_rows=item_rows)
