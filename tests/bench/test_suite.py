"""The benchmark suite: workloads from real code, systems side by side, honest reports."""

from __future__ import annotations

import json

import pytest

from codespec.bench.suite import PLAIN, Request, Result, Run, bar_checks, format_table


def _run(system: str, workload: str, latencies: list[float], tokens: list[tuple[int, ...]]) -> Run:
    requests = [Request(f"s{i}", 10, t, lat, 0.1, passes=2, committed_in_passes=len(t), draft_tokens=3)
                for i, (lat, t) in enumerate(zip(latencies, tokens))]
    return Run(workload, system, requests, 1000.0)


def test_report_reads_medians_ratios_and_identity():
    same = [(1, 2, 3), (4, 5)]
    plain = Result("edit", PLAIN, [_run(PLAIN, "edit", [2.0, 2.0], same)])
    fast = Result("edit", "codespec", [_run("codespec", "edit", [0.5, 0.5], same),
                                       _run("codespec", "edit", [0.4, 0.6], same),
                                       _run("codespec", "edit", [3.0, 3.0], same)], ratio_vs_plain=4.0)
    hf = Result("edit", "hf_prompt_lookup", [_run("hf_prompt_lookup", "edit", [1.0, 1.0], [(1, 2, 3), (9,)])],
                identical_rate=0.5, ratio_vs_plain=1.5, identical={"s0": True, "s1": False})
    j = fast.to_json()
    assert j["wall_s"] == 1.0 and j["wall_s_runs"] == [1.0, 1.0, 6.0]  # the median run, every run kept
    assert j["latency_p50_s"] == 0.5 and j["latency_p95_s"] == 0.6 and j["accepted_tokens_per_pass"] == 1.25
    assert j["draft_tokens_per_pass"] == 1.5
    table = format_table([plain, fast, hf])
    assert "4.00x" in table and "50%" in table
    assert hf.to_json()["identical_per_request"] == {"s0": True, "s1": False}
    assert table.splitlines()[-1] == "  edit/hf_prompt_lookup: s1"  # which requests differ, by name
    checks = bar_checks([plain, fast, hf])
    assert checks["edit: codespec >= 1.5x HF prompt lookup"]  # 5 tok/s vs 2 tok/s
    hf.runs = [_run("hf_prompt_lookup", "edit", [0.2, 0.2], same)]
    assert not bar_checks([plain, fast, hf])["edit: codespec >= 1.5x HF prompt lookup"]


def test_llamacpp_rows_enter_the_bar_and_are_skipped_with_a_reason_when_missing(tmp_path, monkeypatch):
    from codespec.bench.suite import available_systems

    same = [(1, 2, 3), (4, 5)]
    rows = [Result("edit", PLAIN, [_run(PLAIN, "edit", [2.0, 2.0], same)]),
            Result("edit", "codespec", [_run("codespec", "edit", [0.5, 0.5], same)]),
            Result("edit", "llamacpp", [_run("llamacpp", "edit", [1.0, 1.0], same)]),
            Result("edit", "llamacpp-simple", [_run("llamacpp-simple", "edit", [0.9, 0.9], same)]),
            Result("edit", "llamacpp-mod", [_run("llamacpp-mod", "edit", [0.6, 0.6], same)])]
    checks = bar_checks(rows)
    assert not checks["edit: codespec plain >= llama.cpp plain"]  # 1.25 vs 2.5 tok/s
    assert not checks["edit: codespec >= 1.5x llama.cpp's best lookup (llamacpp-mod)"]  # 5 vs 1.5 x 4.17
    rows[3].runs = [_run("llamacpp-simple", "edit", [1.0, 1.0], same)]  # both lookups at 2 tok/s now
    rows[4].runs = [_run("llamacpp-mod", "edit", [1.0, 1.0], same)]
    assert bar_checks(rows)["edit: codespec >= 1.5x llama.cpp's best lookup (llamacpp-simple)"]
    monkeypatch.setenv("CODESPEC_PEERS_DIR", str(tmp_path))  # nothing installed there
    chosen, skipped = available_systems(["codespec", "llamacpp", "llamacpp-lookup"])
    assert [s.name for s in chosen] == [PLAIN, "codespec"]
    assert set(skipped) == {"llamacpp", "llamacpp-simple", "llamacpp-mod", "llamacpp-map-k"}
    assert "install-bench-peers.sh" in skipped["llamacpp"]


def test_plots_are_written(tmp_path):
    from codespec.bench.plots import index_latency_plot, speedup_plot

    results = [{"workload": w, "system": s, "ratio_vs_plain": r}
               for w in ("edit", "repo") for s, r in (("plain", 1.0), ("codespec", 3.2), ("hf_prompt_lookup", 2.1))]
    png = speedup_plot(results, tmp_path / "speedup.png", "test")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    index = [{"tokens": n, "draft_p50_us": 10.0, "draft_p99_us": 40.0, "bytes_per_token": 8.0}
             for n in (10_000, 100_000, 1_000_000)]
    assert index_latency_plot(index, tmp_path / "index.png", "test").stat().st_size > 1000


@pytest.mark.model
def test_workloads_come_from_real_code(default_model):
    from codespec.bench.sessions import WORKLOADS

    tok = default_model.tokenizer
    built = {name: make(tok) for name, make in WORKLOADS.items()}
    repo = built["repo"]
    assert len(repo.steps) == 4 and repo.files and not any("charset.py" in p for p in repo.files)
    text = tok.decode(list(repo.steps[0].prompt([])))
    assert text.count("<|fim_prefix|>") == 1 and text.endswith("<|fim_middle|>")
    # the agent's follow-up resends the model's own earlier answer
    agent = built["agent"]
    follow_up = tok.decode(list(agent.steps[1].prompt(["ANSWER-ONE"])))
    assert "ANSWER-ONE" in follow_up and ("Also rename" in follow_up or "type hints" in follow_up)
    # editor: the prefix only grows (a stable window), so cached prompt prefixes stay
    # valid up to the old cursor (where BPE may merge the newline with the next line)
    editor = [s.prompt([]) for s in built["editor"].steps]
    middle = tok.convert_tokens_to_ids("<|fim_suffix|>")
    prefixes = [p[: p.index(middle)] for p in editor]

    def common(a, b):
        return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))

    assert all(common(a, b) >= len(a) - 2 and len(b) > len(a) for a, b in zip(prefixes, prefixes[1:]))


@pytest.mark.model
def test_suite_runs_systems_side_by_side(default_model, tmp_path):
    from codespec.bench.sessions import WORKLOADS
    from codespec.bench.suite import SYSTEMS, Context, run_suite
    from codespec.settings import Settings

    tok = default_model.tokenizer
    editor = WORKLOADS["editor"](tok, requests=2, max_new_tokens=6)
    edit = WORKLOADS["edit"](tok, count=1, max_new_tokens=6)
    systems = [s for s in SYSTEMS if s.name in (PLAIN, "hf_prompt_lookup", "codespec-prompt", "codespec")]
    ctx = Context(default_model, Settings(), slot_tokens=2048)
    results = run_suite(ctx, [edit, editor], systems, repeat=1)
    rows = {(r.workload, r.system): r.to_json() for r in results}
    assert set(rows) == {(w, s.name) for w in ("edit", "editor") for s in systems}
    for (workload, system), row in rows.items():
        assert row["tokens"] > 0 and row["peak_rss_mb"] > 0 and row["latency_p95_s"] >= row["latency_p50_s"]
        if system.startswith("codespec"):
            assert row["identical_rate"] == 1.0 and row["accepted_tokens_per_pass"] >= 1.0
            assert list(row["identical_per_request"].values()) == [True] * row["requests"]
    # the editor's second request reuses the first one's cached prompt; plain never does
    assert rows["editor", "codespec"]["cached_prompt_tokens"] > 0
    assert rows["editor", PLAIN]["cached_prompt_tokens"] == 0
    assert rows["edit", "hf_prompt_lookup"]["ttft_p50_s"] is not None
    json.dumps([r.to_json() for r in results])  # the JSON line is serialisable
