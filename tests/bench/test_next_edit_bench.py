"""`codespec bench next-edit`'s cases and report (the model runs in the suite itself)."""

from __future__ import annotations

import ast
import re

from codespec.bench.next_edit import KINDS, Answer, cases, summary


def test_cases_of_every_kind_where_the_truth_follows_the_change():
    found = cases(per_kind=2)
    assert [c.kind for c in found] == [k for k in KINDS for _ in range(2)]
    for case in found:
        assert case.before != case.after and 0 <= case.cursor <= len(case.after)
        ast.parse(case.after), ast.parse(case.truth)  # real code before and after the edit
        if case.kind == "no-op":
            assert case.truth == case.after
        elif case.kind == "refactor":  # reads of `self.x` become the new local `x`
            assert len(case.truth) < len(case.after)
            (local, attr), = re.findall(r"^\s*(\w+) = self\.(\w+)$", case.after[:case.cursor + 1], re.M)[-1:]
            assert local == attr and f"self.{attr}" not in case.truth[case.cursor:case.cursor + 400]
        else:
            assert case.truth != case.after and len(case.truth) > len(case.after)
        if case.kind == "add-param":  # the signature has it, and the calls pass it
            assert case.after.count("strict") + 1 <= case.truth.count("strict")


def test_the_summary_reports_latency_exactness_and_identity():
    (case, other) = cases(per_kind=1)[:2]
    answers = [Answer(case, "plain", 2.0, [1, 2, 3], 3, True, False),
               Answer(case, "codespec", 0.5, [1, 2, 3], 1, True, False),
               Answer(other, "plain", 4.0, [4], 1, False, True),
               Answer(other, "codespec", 1.0, [4], 1, False, True)]
    facts = summary(answers)
    assert facts["identical"] and facts["codespec_vs_plain"] == 4.0
    assert facts["codespec"]["p50_s"] == 0.75 and facts["codespec"]["tokens_per_pass"] == 2.0
    assert facts["codespec"]["exact_by_kind"][case.kind] == "1/1"
    answers[1] = Answer(case, "codespec", 0.5, [1, 2, 9], 1, True, False)
    assert not summary(answers)["identical"]
