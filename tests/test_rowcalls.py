"""Row-exact attention calls: how a pass's rows become calls, that a call computes
attention, and that the probe notices when rows stop being independent of their call."""

from __future__ import annotations

import pytest
import torch

from codespec.forward import rowcalls
from codespec.index import Draft
from codespec.verify.tree import VerifyTree

GROUP = 4  # query heads per KV head


def tree_with_branches() -> VerifyTree:
    # pending 9; main path 9 -> 1 -> 2 -> 3; a branch 6 -> 7 under 1; a second root 5
    draft = Draft((1, 2, 3, 5, 6, 7), (-1, 0, 1, -1, 0, 4), (4, 3, 3, 1, 1, 1), 2, "test")
    return VerifyTree.build(9, draft)


def test_padded_plan_gives_each_chain_of_the_tree_one_call():
    tree = tree_with_branches()
    assert tree.tokens == (9, 1, 2, 3, 6, 7, 5) and tree.chains() == [(0, 4), (4, 6), (6, 7)]
    calls = rowcalls.plan_calls([(0, 4, VerifyTree.chain(7)), (1, 600, tree)], padded=True, group=GROUP,
                                dtype=torch.float32, device="cpu")
    assert [(c.slot, c.first_row, c.rows) for c in calls] == [(0, 0, 1), (1, 1, 4), (1, 5, 2), (1, 7, 1)]
    decode, main, branch, root = calls
    assert decode.keys == 512 and main.keys == 1024  # padded: whole 512-key blocks
    assert main.path is None and [seen(main)] == [[601, 602, 603, 604]]
    # the branch reads the context, then 9 -> 1 -> 6 -> 7 (slot positions 600, 601, 604, 605)
    assert branch.context == 600 and branch.path.tolist() == [600, 601, 604, 605]
    assert seen(branch) == [603, 604] and root.path.tolist() == [600, 606] and seen(root) == [602]


def test_a_long_chain_splits_into_balanced_batch_elements_of_whole_tokens():
    per = rowcalls.tokens_per_element(7)
    call = rowcalls.plan_calls([(0, 500, VerifyTree.chain(1, [2] * (2 * per)))], padded=True, group=7,
                               dtype=torch.float32, device="cpu")[0]
    assert (call.elements, call.tokens) == (3, per * 2 // 3 + 1)  # 2 * per + 1 rows in 3 elements
    assert call.mask.shape == (3, 1, call.tokens * 8, 1024)  # 7 heads laid out in 8 query rows a token
    assert seen(call)[: call.rows] == list(range(501, 501 + call.rows))  # past one key block
    assert seen(call)[call.rows:] == [1] * (3 * call.tokens - call.rows)  # padding tokens see one key


def seen(call):
    """Keys each token position of a call sees (the same for every query row of a token)."""
    slots = call.mask.shape[2] // call.tokens
    per_row = (call.mask == 0).sum(dim=-1).view(call.elements * call.tokens, slots)
    assert (per_row == per_row[:, :1]).all()
    return per_row[:, 0].tolist()


def test_lean_plan_gives_every_row_a_call_with_exactly_its_keys():
    tree = tree_with_branches()
    calls = rowcalls.plan_calls([(3, 20, tree)], padded=False, group=GROUP, dtype=torch.float32, device="cpu")
    assert len(calls) == len(tree) and all(c.rows == 1 and c.mask is None for c in calls)
    for node, call in enumerate(calls):
        assert call.first_row == node and call.keys == 20 + len(tree.path(node))
        if call.path is not None:
            assert call.path.tolist() == [20 + n for n in tree.path(node)]


@pytest.mark.parametrize("rows", [1, 5, 2 * rowcalls.tokens_per_element(GROUP) + 3])
def test_a_padded_call_computes_each_rows_attention(rows):
    torch.manual_seed(0)
    kv_heads, start, dim = 2, 40, 16
    keys, values = torch.randn(2, 1, kv_heads, 512, dim, dtype=torch.float64)
    query = torch.randn(kv_heads * GROUP, rows, dim, dtype=torch.float64)
    call = rowcalls.plan_calls([(0, start, VerifyTree.chain(1, [2] * (rows - 1)))], padded=True, group=GROUP,
                               dtype=torch.float64, device="cpu")[0]
    out = rowcalls.attend(query, keys[:, :, : call.keys], values[:, :, : call.keys], call, 0.25)
    for row in range(rows):
        seen = start + row + 1
        k = keys[0, :, :seen].repeat_interleave(GROUP, dim=0)  # [heads, seen, dim]
        v = values[0, :, :seen].repeat_interleave(GROUP, dim=0)
        weights = torch.softmax(0.25 * query[:, row : row + 1] @ k.transpose(1, 2), dim=-1)
        torch.testing.assert_close(out[row], (weights @ v)[:, 0], rtol=1e-12, atol=1e-12)


def test_probe_fails_when_a_rows_result_depends_on_its_call(monkeypatch):
    exact = rowcalls.attend

    def drifting(query, keys, values, call, scale):  # what a batch-dependent kernel would do
        return exact(query, keys, values, call, scale) * (1 + 1e-3 * (call.rows > 1))

    monkeypatch.setattr(rowcalls, "attend", drifting)
    assert not rowcalls.probe(torch.float32, "cpu", 1, GROUP, 32)


def test_padded_length():
    assert [rowcalls.padded_length(n) for n in (1, 511, 512, 513, 544, 545)] == [512, 512, 512, 1024, 1024, 1024]


def test_every_row_of_a_padded_call_equals_its_decode_call_in_bf16_across_contexts():
    """A cause of rows that differed from their steps, swept: the default model's head layout (2 KV heads, 7 query
    heads each, 64 dims) in bfloat16, chains of 2..40 rows whose pending token sits
    anywhere from 0 to 4k keys. Every row must get, bit for bit, what its one-row
    (decode) call gives. Keys padded to a multiple of 32 failed this on an AVX-512 BF16
    EPYC (20 of 6,650 rows, contexts past 1.2k)."""
    kv_heads, group, dim, dtype = 2, 7, 64, torch.bfloat16
    generator = torch.Generator().manual_seed(1)
    longest = 4200
    keys, values = torch.randn(2, 1, kv_heads, rowcalls.padded_length(longest), dim, generator=generator).to(dtype)
    queries = torch.randn(kv_heads * group, 40, dim, generator=generator).to(dtype)

    def call(start, first, rows):
        c = rowcalls.plan_calls([(0, start + first, VerifyTree.chain(1, [2] * (rows - 1)))], padded=True,
                                group=group, dtype=dtype, device="cpu")[0]
        return rowcalls.attend(queries[:, first : first + rows], keys[:, :, : c.keys], values[:, :, : c.keys], c, None)

    differ = []
    for start in range(0, 4100, 97):
        alone = torch.cat([call(start, i, 1) for i in range(40)])
        for rows in (2, 3, 5, 9, 17, 24, 33, 40):
            together = call(start, 0, rows)
            differ += [(start, rows, i) for i in range(rows) if not torch.equal(together[i], alone[i])]
    assert not differ, f"rows (start, rows, row) that differ from their decode call: {differ[:10]}"
