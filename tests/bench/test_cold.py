"""`codespec bench cold`'s report: checks, summary and commands, on hand-made runs (the
processes themselves run in `codespec bench cold`, minutes each)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from codespec.bench.cold import ColdResult, ColdRun, checks, format_table, new_tokens, summary, worker_command

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
    plain = worker_command("plain", Path("p.txt"), 320, Path("i.idx"), flags, Path("pred.txt"))
    spec = worker_command("codespec", Path("p.txt"), 128, Path("i.idx"), flags, Path("pred.txt"))
    predicted = worker_command("codespec-prediction", Path("p.txt"), 400, None, flags, Path("pred.txt"))
    hf = worker_command("hf_prompt_lookup", Path("p.txt"), 320, None, flags)
    assert "--no-spec" in plain and "--index" not in plain and "--prediction" not in plain and plain[-1] == "p.txt"
    assert spec[spec.index("--index") + 1] == "i.idx" and spec[spec.index("--max-new-tokens") + 1] == "128"
    assert "--prediction" not in spec and predicted[predicted.index("--prediction") + 1] == "pred.txt"
    assert hf[1:3] == ["-m", "codespec.bench.cold"] and "--cache-dir" in hf
    assert new_tokens(SimpleNamespace(kind="fim")) == 128 and new_tokens(SimpleNamespace(kind="x", max_new_tokens=9)) == 9


def test_the_apply_bar_and_a_system_that_ran_on_some_requests_only():
    systems = ["plain", "hf_prompt_lookup", "codespec", "codespec-prediction"]
    found = ColdResult()
    for system, net in {"plain": 20.0, "hf_prompt_lookup": 9.0, "codespec": 5.5, "codespec-prediction": 4.5}.items():
        found.add(ColdRun("apply:a", "apply", system, [1, 2], wall_s=net + 1, model_load_s=1.0, first_token_s=2.0))
        if system != "codespec-prediction":  # a request without a prediction
            found.add(ColdRun("edit:b", "edit", system, [3], wall_s=4.0, model_load_s=1.0, first_token_s=2.0))
    good = checks(found, systems)
    assert good["codespec-prediction >= 4x plain on apply (net time)"]
    assert good["codespec-prediction >= 2x hf_prompt_lookup on apply (net time)"]
    assert good["codespec-prediction identical to plain on every request"]
    facts = summary(found, systems)
    assert "edit:b" in facts["requests"] and "codespec-prediction" not in facts["requests"]["edit:b"]
    table = format_table(found, systems)
    assert "| apply:a | 2 | 20.00 | 9.00 | 5.50 | 4.50 | 4.44x | 2.00x |" in table
    assert "| edit:b | 1 | 3.00 | 3.00 | 3.00 |  | 1.00x |" in table


def test_apply_requests_carry_their_code_as_the_prediction():
    from codespec.bench.apply import APPLY_COUNT, AGENT_COUNT, MARKER, apply_requests
    from codespec.models.loading import load_tokenizer
    from codespec.settings import Settings

    tokenizer = load_tokenizer(Settings(), progress=False)
    requests = apply_requests(tokenizer)
    assert [r.kind for r in requests] == ["apply"] * APPLY_COUNT + ["agent"] * AGENT_COUNT
    assert len({r.name for r in requests}) == len(requests)
    for request in requests:
        prompt = tokenizer.decode(list(request.prompt_ids))
        assert request.prediction in prompt and request.max_new_tokens > 48
        if request.kind == "apply":
            assert MARKER in prompt and "<update>" in prompt
        else:
            assert "<tool_response>" in prompt and '"name": "read_file"' in prompt
