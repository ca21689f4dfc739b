"""Rotary and the KV store in one launch (forward/cuda/rope_store.py) under the Triton
interpreter: the same bits as transformers' arithmetic, K and V where the rows say."""

from __future__ import annotations

import pytest
import torch

from codespec.forward.cuda.rope_store import rope_store, rope_store_ref

pytest.importorskip("triton", reason="triton is a test dependency (pip install -e '.[test]')")

HEADS, KV_HEADS, DIM = 14, 2, 64


def inputs(dtype: torch.dtype):
    torch.manual_seed(0)
    rows = 5
    qkv = torch.randn(rows, (HEADS + 2 * KV_HEADS) * DIM).to(dtype)
    angle = torch.randn(rows, DIM)
    meta = dict(source=torch.tensor([0, 1, 2, 0, 0]),  # rows 3 and 4: padding, storing row 0's KV
                write_slots=torch.tensor([1, 1, 0, 1, 1]), write_positions=torch.tensor([7, 8, 2, 7, 7]))
    return qkv, angle.cos().to(dtype), angle.sin().to(dtype), meta


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a, b)


def within_a_rounding(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The interpreter rounds float32 to bf16 toward zero (triton 3.9), the GPU to nearest:
    under it bf16 results may differ by one rounding; scripts/gpu_check.py checks the bits
    on CUDA."""
    return torch.allclose(a.float(), b.float(), rtol=2 ** -6, atol=0.05)  # three roundings of O(1) terms


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_has_the_references_bits_and_stores_where_the_rows_say(dtype):
    qkv, cos, sin, meta = inputs(dtype)
    stores = [torch.zeros(2, KV_HEADS, 16, DIM, dtype=dtype) for _ in range(4)]
    q = rope_store(qkv, cos, sin, *meta.values(), stores[0], stores[1], heads=HEADS, kv_heads=KV_HEADS,
                   force_triton=True)
    expected = rope_store(qkv, cos, sin, *meta.values(), stores[2], stores[3], heads=HEADS, kv_heads=KV_HEADS,
                          force_triton=False)
    same = same_bits if dtype == torch.float32 else within_a_rounding
    assert same(q, expected)
    assert same(stores[0], stores[2]) and torch.equal(stores[1], stores[3])  # V: copied, never rounded
    _, k, v = rope_store_ref(qkv, cos, sin, HEADS, KV_HEADS, DIM)
    assert same(stores[0][1, :, 8], k[1]) and torch.equal(stores[1][0, :, 2], v[2])
    assert same(stores[0][1, :, 7], k[0])  # padding rows wrote row 0's K again
    written = {(1, 7), (1, 8), (0, 2)}
    untouched = [(s, p) for s in range(2) for p in range(16) if (s, p) not in written]
    assert all(torch.count_nonzero(stores[0][s, :, p]) == 0 for s, p in untouched)


def test_rotary_is_transformers_own():
    from transformers.models.qwen2.modeling_qwen2 import apply_rotary_pos_emb

    qkv, cos, sin, _ = inputs(torch.bfloat16)
    q, k, _ = rope_store_ref(qkv, cos, sin, HEADS, KV_HEADS, DIM)
    rows = qkv.shape[0]
    raw_q = qkv[:, :HEADS * DIM].reshape(rows, HEADS, DIM).transpose(0, 1)[None]
    raw_k = qkv[:, HEADS * DIM:(HEADS + KV_HEADS) * DIM].reshape(rows, KV_HEADS, DIM).transpose(0, 1)[None]
    hf_q, hf_k = apply_rotary_pos_emb(raw_q, raw_k, cos[None], sin[None])
    assert torch.equal(hf_q[0].transpose(0, 1), q) and torch.equal(hf_k[0].transpose(0, 1), k)


def test_rows_without_a_token_are_skipped_and_the_others_have_the_same_bits():
    """With `live`, padding rows (3 and 4: no context, no path) leave their q alone (7
    here) and store nothing; the real rows' q, K and V are what every row gets without it."""
    qkv, cos, sin, meta = inputs(torch.float32)
    full = [torch.zeros(2, KV_HEADS, 16, DIM) for _ in range(2)]
    q_full = rope_store(qkv, cos, sin, *meta.values(), *full, heads=HEADS, kv_heads=KV_HEADS, force_triton=True)
    live = (torch.tensor([12, 0, 3, 0, 0]), torch.tensor([0, 2, 0, 0, 0]))  # row 1 by its path alone
    stores = [torch.zeros(2, KV_HEADS, 16, DIM) for _ in range(2)]
    garbage = qkv.clone()
    garbage[3:] = float("nan")  # a padding row's own values: never read
    q = torch.full((5, HEADS, DIM), 7.0)
    rope_store(garbage, cos, sin, *meta.values(), *stores, heads=HEADS, kv_heads=KV_HEADS, out=q, live=live,
               force_triton=True)
    assert torch.equal(q[:3], q_full[:3]) and torch.equal(q[3:], torch.full((2, HEADS, DIM), 7.0))
    assert torch.equal(stores[0], full[0]) and torch.equal(stores[1], full[1])


@pytest.mark.parametrize("force_triton", [True, False])
def test_tables_read_at_each_rows_position_are_the_rows_own_cos_and_sin(force_triton):
    """With `positions`, cos and sin are tables read at each row's position (a padding
    row's at its source row's): the bits of passing each row its own."""
    qkv, _, _, meta = inputs(torch.float32)
    table = torch.randn(32, DIM)
    cos_table, sin_table = table.cos(), table.sin()
    positions = torch.tensor([20, 3, 9, 20, 20])
    own = [torch.zeros(2, KV_HEADS, 16, DIM) for _ in range(2)]
    expected = rope_store(qkv, cos_table[positions], sin_table[positions], *meta.values(), *own, heads=HEADS,
                          kv_heads=KV_HEADS, force_triton=force_triton)
    read = [torch.zeros(2, KV_HEADS, 16, DIM) for _ in range(2)]
    got = rope_store(qkv, cos_table, sin_table, *meta.values(), *read, heads=HEADS, kv_heads=KV_HEADS,
                     positions=positions, force_triton=force_triton)
    assert torch.equal(got, expected) and torch.equal(read[0], own[0]) and torch.equal(read[1], own[1])
