"""Row-exact attention calls: how a pass's rows become calls, that a call computes
attention, and that the probe notices when rows stop being independent of their call."""

from __future__ import annotations

import torch

from codespec import rowcalls
from codespec.index import Draft
from codespec.tree import VerifyTree

GROUP = 4  # query heads per KV head


def tree_with_branches() -> VerifyTree:
    # pending 9; main path 9 -> 1 -> 2 -> 3; a branch 6 -> 7 under 1; a second root 5
    draft = Draft((1, 2, 3, 5, 6, 7), (-1, 0, 1, -1, 0, 4), (4, 3, 3, 1, 1, 1), 2, "test")
    return VerifyTree.build(9, draft)


def test_padded_plan_gives_each_chain_of_the_tree_one_call():
    tree = tree_with_branches()
    assert tree.tokens == (9, 1, 2, 3, 6, 7, 5) and rowcalls.chains(tree) == [(0, 4), (4, 6), (6, 7)]
    calls = rowcalls.plan_calls([(0, 4, VerifyTree.chain(7)), (1, 600, tree)], padded=True, group=GROUP,
                                dtype=torch.float32, device="cpu")
    assert [(c.slot, c.first_row, c.rows) for c in calls] == [(0, 0, 1), (1, 1, 4), (1, 5, 2), (1, 7, 1)]
    decode, main, branch, root = calls
    assert decode.keys == 512 and main.keys == 608  # padded: at least 512, a multiple of 32
    assert main.path is None and [seen(main)] == [[601, 602, 603, 604]]
    # the branch reads the context, then 9 -> 1 -> 6 -> 7 (slot positions 600, 601, 604, 605)
    assert branch.context == 600 and branch.path.tolist() == [600, 601, 604, 605]
    assert seen(branch) == [603, 604] and root.path.tolist() == [600, 606] and seen(root) == [602]


def seen(call):
    """Keys each row of a call sees (the same for every query head of a row)."""
    per_head = (call.mask == 0).sum(dim=1).view(call.rows, GROUP)
    assert (per_head == per_head[:, :1]).all()
    return per_head[:, 0].tolist()


def test_lean_plan_gives_every_row_a_call_with_exactly_its_keys():
    tree = tree_with_branches()
    calls = rowcalls.plan_calls([(3, 20, tree)], padded=False, group=GROUP, dtype=torch.float32, device="cpu")
    assert len(calls) == len(tree) and all(c.rows == 1 and c.mask is None for c in calls)
    for node, call in enumerate(calls):
        assert call.first_row == node and call.keys == 20 + len(tree.path(node))
        if call.path is not None:
            assert call.path.tolist() == [20 + n for n in tree.path(node)]


def test_a_padded_call_computes_each_rows_attention():
    torch.manual_seed(0)
    kv_heads, rows, start, dim = 2, 5, 40, 16
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
    assert [rowcalls.padded_length(n) for n in (1, 511, 512, 513, 544, 545)] == [512, 512, 512, 544, 544, 576]
