"""`codespec check`: its rows stage finds a row that differs from its step, and passes
every exact backend on tiny models; the command runs end to end on the default model."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from codespec.bench.check import pass_costs, random_tree, row_checks, run_checks
from codespec.forward import rowblocks
from codespec.forward.select import of_model
from codespec.forward.select import Loaded
from codespec.kernels import rowgemm
from tests.tiny import tiny_model
from codespec.settings import Settings


def loaded_of(model, backend: str) -> Loaded:
    forward = of_model(model, backend=backend)
    return Loaded("tiny", "", forward, None, "", "", model=model,
                  parameters=sum(p.numel() for p in model.parameters()))


# the row decoder's kernel needs heads of 64 dims and widths in whole 64-column stripes
ROW_DECODER_SHAPE = dict(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, intermediate_size=192)


@pytest.mark.parametrize("backend", ["transformers", "cuda", "rowdecoder"])
def test_every_row_equals_its_step(backend, monkeypatch):
    if backend == "rowdecoder":
        if rowgemm.library() is None:
            pytest.skip(f"no kernel build: {rowgemm.unavailable()}")
        monkeypatch.setattr(rowblocks, "linear_kernel", lambda dtype, device: "rowgemm")
        model = tiny_model(vocab_size=256, dtype=torch.bfloat16, **ROW_DECODER_SHAPE)
    else:
        model = tiny_model()
    loaded = loaded_of(model, backend)
    report = run_checks(loaded, Settings())
    assert report["rows"]["ok"] and report["rows"]["rows_checked"] >= 20
    assert set(report["passes"]["ms_per_pass"]) == {1, 8, 16, 32, 64}
    assert report["plain"]["weights_mb"] > 0 and report["ok"]


class OffByOneUlp:
    """A forward whose passes of several rows nudge their last row: not row-exact."""

    def __init__(self, forward):
        self.inner = forward

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def logits(self, cache, requests):
        logits = self.inner.logits(cache, requests).clone()
        if logits.shape[0] > 1:
            logits[-1] = torch.nextafter(logits[-1], torch.full_like(logits[-1], float("inf")))
        return logits


def test_a_row_that_differs_from_its_step_fails_the_check():
    loaded = loaded_of(tiny_model(), "transformers")
    loaded.forward = OffByOneUlp(loaded.forward)
    rows = row_checks(loaded, Settings(), contexts=(40,), nodes=10, every=1)
    assert rows["rows_differing"] >= 1 and not rows["ok"]
    assert rows["differing"][0]["context"] == 40


def test_random_trees_are_trees():
    tree = random_tree(np.random.default_rng(0), 100, 32)
    assert tree.parents[0] == -1 and all(0 <= p < i for i, p in enumerate(tree.parents) if i)
    assert all(tree.depths[i] == tree.depths[p] + 1 for i, p in enumerate(tree.parents) if i)


def test_pass_costs_grow_with_rows_on_a_tiny_model():
    costs = pass_costs(loaded_of(tiny_model(), "transformers"), Settings(), repeat=3)
    assert all(ms > 0 for ms in costs["ms_per_pass"].values())


@pytest.mark.model
def test_the_command_on_the_default_model(default_model, tmp_path, capsys):
    from codespec.cli.main import main

    out = tmp_path / "check.json"
    assert main(["check", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["ok"] and report["rows"]["rows_differing"] == 0
    assert "all checks passed" in capsys.readouterr().out


def test_a_report_path_in_no_folder_is_one_line_before_any_work(tmp_path, capsys):
    from codespec.cli.main import main

    assert main(["check", "--json", str(tmp_path / "missing" / "check.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("codespec: error: --json ") and "does not exist" in err and err.count("\n") == 1
