"""Row-block probing: the block is where a machine's linear kernels change results."""

from __future__ import annotations

import types

import pytest
import torch
import torch.nn.functional as F

from codespec.forward import rowblocks


row_by_row = types.SimpleNamespace(  # every row count multiplies alike
    linear=lambda x, weight, bias=None: torch.cat([F.linear(r, weight, bias) for r in x.split(1)]))


def kernels_switching_past(rows: int):
    """A stand-in for torch.nn.functional whose linear changes its last bits past `rows`."""
    def linear(x, weight, bias=None):
        out = row_by_row.linear(x, weight, bias)
        return out + 1e-3 if x.shape[-2] > rows else out
    return types.SimpleNamespace(linear=linear)


def model():
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 8)).double()


def test_probe_finds_the_most_rows_that_multiply_like_two(monkeypatch):
    monkeypatch.setattr(rowblocks, "F", kernels_switching_past(5))
    assert rowblocks.probe(model()) == 5
    monkeypatch.setattr(rowblocks, "F", row_by_row)
    assert rowblocks.probe(model(), limit=12) == 12  # nothing breaks: the limit


def test_a_machine_that_breaks_at_three_rows_fails_safe_and_says_so(monkeypatch):
    monkeypatch.setattr(rowblocks, "F", kernels_switching_past(2))
    with pytest.warns(RuntimeWarning, match="row by row"):
        assert rowblocks.probe(model()) == rowblocks.ROW_BY_ROW


def test_row_by_row_multiplies_each_row_as_the_top_of_a_two_row_call(monkeypatch):
    layer = torch.nn.Linear(8, 4).double()
    rowblocks.install(layer)
    x = torch.randn(1, 5, 8, dtype=torch.float64)
    calls = []
    spy = lambda a, w, b=None: calls.append(tuple(a.shape)) or F.linear(a, w, b)  # noqa: E731
    monkeypatch.setattr(rowblocks, "F", types.SimpleNamespace(linear=spy))
    with rowblocks.blocked(rowblocks.ROW_BY_ROW):
        out = layer(x)
    assert calls == [(1, 2, 8)] * 5
    expected = torch.cat([F.linear(torch.cat([x[:, i : i + 1]] * 2, dim=1), layer.weight, layer.bias)[:, :1]
                          for i in range(5)], dim=1)
    assert torch.equal(out, expected)


def test_blocked_passes_equal_one_block_at_a_time():
    layer = torch.nn.Linear(8, 4).double()
    rowblocks.install(layer)
    x = torch.randn(11, 8, dtype=torch.float64)
    with rowblocks.blocked(4):
        out = layer(x)
    parts = [F.linear(p, layer.weight, layer.bias) for p in x.split(rowblocks.sizes(11, 4))]
    assert torch.equal(out, torch.cat(parts))


def test_prefill_products_run_in_float32_only_where_bf16_has_no_gemm(monkeypatch):
    """Inside `prefill_products`, a bf16 product of UPCAST_ROWS+ rows on a CPU without
    AVX-512 is the float32 product rounded once; outside it (decode steps, verify passes),
    and below UPCAST_ROWS rows, the bf16 product as before. The choice depends on the
    machine and the row count alone, so a prefill stays deterministic per pass."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 48, dtype=torch.bfloat16)
    monkeypatch.setenv("CODESPEC_LINEAR", "torch")  # F.linear's path (rowgemm, where it runs, packs the weight)
    rowblocks.install(layer)
    x = torch.randn(1, 40, 64, dtype=torch.bfloat16)
    wide = torch.nn.functional.linear(x.float(), layer.weight.float(), layer.bias.float()).to(torch.bfloat16)
    seen = []
    linear = torch.nn.functional.linear
    monkeypatch.setattr(rowblocks.F, "linear", lambda a, w, b=None: seen.append(a.dtype) or linear(a, w, b))
    for without_gemm in (True, False):
        monkeypatch.setattr(rowblocks, "_bf16_without_gemm", lambda: without_gemm)
        seen.clear()
        layer(x)
        with rowblocks.prefill_products():
            out = layer(x)
            layer(x[:, : rowblocks.UPCAST_ROWS - 1])
        assert seen == [torch.bfloat16, torch.float32 if without_gemm else torch.bfloat16, torch.bfloat16]
        if without_gemm:
            assert torch.equal(out, wide)
