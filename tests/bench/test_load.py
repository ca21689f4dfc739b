"""`codespec bench load`: its requests, and a real run at two levels over a tiny model
(a fresh `codespec serve` process per level)."""

from __future__ import annotations

import io
import os

from codespec.bench import load
from tests.caches import fresh_cache
from tests.lsp.tiny_fim import tiny_fim_model


def test_the_requests_are_short_mixed_and_fixed():
    reqs = load.requests(24)
    assert len(reqs) == 24 and len({r.name for r in reqs}) == 24
    kinds = [r.name.rsplit(":", 1)[1] for r in reqs]
    assert kinds.count("fim") == kinds.count("completion") == kinds.count("chat") == 8
    for r in reqs:
        assert r.body["max_tokens"] == load.NEW_TOKENS and r.body["temperature"] == 0
        text = r.body.get("prompt") or r.body["messages"][0]["content"]
        assert 0 < len(text) < 6000  # short: a few hundred tokens
    assert [r.body for r in reqs] == [r.body for r in load.requests(24)]  # the same every run


def test_two_levels_against_a_real_server(tmp_path):
    model = tiny_fim_model(tmp_path / "model")
    reqs = [r for r in load.requests(6) if not r.name.endswith(":chat")]  # the tiny model has no chat template
    env = {**os.environ, "CODESPEC_MODEL": str(model), "CODESPEC_CACHE_DIR": fresh_cache(tmp_path / "cache")}
    lines: list[str] = []
    levels = load.run_load(reqs, (1, 2), lines.append, env=env)
    assert [lv.concurrency for lv in levels] == [1, 2] and len(lines) == 2
    for level in levels:
        assert not level.failures, level.failures
        assert level.tokens > 0 and all(lat > 0 for lat in level.latencies_s)
    record = levels[1].to_json(levels[0])
    assert record["outputs_equal_to_1"] is True  # batching changed no token
    assert record["requests"] == len(reqs) and record["throughput_vs_1"] > 0
    table = io.StringIO()
    load.print_table(levels, table)
    assert "same output" in table.getvalue() and table.getvalue().count("\n") == 3
