"""`codespec bench cold`'s report: checks, summary and commands, on hand-made runs (the
processes themselves run in `codespec bench cold`, minutes each)."""

from __future__ import annotations

from pathlib import Path

from codespec.bench.cold import ColdResult, ColdRun, checks, format_table, summary, worker_command

SYSTEMS = ["plain", "hf_prompt_lookup", "codespec"]


def result(edit_seconds: dict[str, float], fim_codespec_tokens: list[int] | None = None) -> ColdResult:
    found = ColdResult()
    for system, net in edit_seconds.items():
        found.add(ColdRun("edit:a", "edit", system, [1, 2, 3], wall_s=net + 3.0, model_load_s=3.0, first_token_s=6.0))
        tokens = fim_codespec_tokens if system == "codespec" and fim_codespec_tokens else [7, 8]
        found.add(ColdRun("fim:b", "fim", system, tokens, wall_s=10.0, model_load_s=3.0, first_token_s=9.0))
    return found


def test_checks_pass_only_when_every_part_of_the_bar_holds():
    good = checks(result({"plain": 12.0, "hf_prompt_lookup": 6.0, "codespec": 4.0}), SYSTEMS)
    assert all(good.values()) and len(good) == 3
    slow = checks(result({"plain": 12.0, "hf_prompt_lookup": 5.0, "codespec": 4.0}), SYSTEMS)
    assert not slow["codespec >= 1.5x hf_prompt_lookup on edit (net time)"]
    worse = checks(result({"plain": 3.9, "hf_prompt_lookup": 6.0, "codespec": 4.0}), SYSTEMS)
    assert not worse["codespec net time <= plain on every request"]
    differs = checks(result({"plain": 12.0, "hf_prompt_lookup": 6.0, "codespec": 4.0}, [7, 9]), SYSTEMS)
    assert not differs["codespec identical to plain on every request"]


def test_summary_and_table_report_net_time_and_identity():
    found = result({"plain": 12.0, "hf_prompt_lookup": 6.0, "codespec": 4.0})
    facts = summary(found, SYSTEMS)
    assert facts["codespec"]["edit_net_s"] == 4.0 and facts["codespec"]["fim_net_s"] == 7.0
    assert facts["requests"]["edit:a"]["plain"]["net_s"] == 12.0
    assert facts["codespec"]["cold_start_to_first_token_s"] == 7.5
    table = format_table(found, SYSTEMS)
    assert "| edit:a | 3 | 12.00 | 6.00 | 4.00 | 3.00x | 1.50x |" in table and "NO" not in table


def test_worker_commands_give_each_system_its_own_process_and_flags():
    flags = ["--cache-dir", "/c"]
    plain = worker_command("plain", Path("p.txt"), "edit", Path("i.idx"), flags)
    spec = worker_command("codespec", Path("p.txt"), "fim", Path("i.idx"), flags)
    hf = worker_command("hf_prompt_lookup", Path("p.txt"), "edit", None, flags)
    assert "--no-spec" in plain and "--index" not in plain and plain[-1] == "p.txt"
    assert spec[spec.index("--index") + 1] == "i.idx" and spec[spec.index("--max-new-tokens") + 1] == "128"
    assert hf[1:3] == ["-m", "codespec.bench.cold"] and "--cache-dir" in hf
