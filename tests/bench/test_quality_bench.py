"""`codespec bench quality`'s cases, layouts and scores (the model runs in the suite itself)."""

from __future__ import annotations

import pytest

from codespec import prompts
from codespec.bench.quality import KINDS, LAYOUTS, Case, Scored, cases, prompt_ids, score, summary


def test_cases_are_cursors_in_real_code_with_the_text_that_follows():
    found = cases(per_file=1)
    assert {c.kind for c in found} == set(KINDS) and len(found) >= 10
    for case in found:
        source = case.text[:case.offset] + case.truth + case.text[case.offset:]  # the file, whole
        compile(source, case.path, "exec")
        if case.kind == "line":  # mid-line, after `(`, ` = ` or `return `; the line ends there
            assert "\n" not in case.truth and case.text[case.offset - 1] in "( "
            assert case.text[case.offset] == "\n"
        else:  # at a line's start, whole lines follow
            assert case.offset == 0 or case.text[case.offset - 1] == "\n"
            assert case.truth.endswith("\n")
        assert case.context and all(e.text for e in case.context)  # the package's other files


def _case(kind: str, truth: str) -> Case:
    return Case("p/f.py:1", kind, "f.py", "x = " + truth, 4, truth, ())


def test_a_line_scores_the_rest_of_the_line_and_a_block_its_lines():
    line = _case("line", "compute(a, b)")
    assert score(line, " compute(a, b)\n    more") == (True, 1.0)
    exact, similarity = score(line, "compute(a, c)")
    assert not exact and 0.9 < similarity < 1.0
    block = _case("block", "    a = 1\n    b = 2\n")
    assert score(block, "    a = 1  \n    b = 2\n    c = 3\n")[0]  # lines past the truth's are not read
    assert not score(block, "    a = 1\n    b = 3\n")[0]
    assert score(block, "")[1] == 0.0


def test_the_summary_is_per_layout_context_and_kind():
    line, block = _case("line", "f(x)"), _case("block", "    y\n")
    scored = [Scored(line, "repo", False, "f(x)", True, 1.0, 10), Scored(line, "repo", True, "g", False, 0.25, 20),
              Scored(block, "repo", False, "    y", True, 1.0, 12)]
    facts = summary(scored)
    assert facts["repo"]["line"] == {"exact": 1.0, "similarity": 1.0, "cases": 1, "prompt_tokens": 10}
    assert facts["repo +context"]["line"]["exact"] == 0.0 and "block" not in facts["repo +context"]


@pytest.fixture(scope="module")
def tokenizer():
    from codespec.models.loading import load_tokenizer
    from codespec.settings import Settings

    return load_tokenizer(Settings(), progress=False)


@pytest.mark.model
def test_each_layout_holds_the_cursor_s_surroundings_and_the_context_when_asked(tokenizer):
    case = next(c for c in cases(per_file=1) if c.kind == "line")
    before = case.text[:case.offset].rsplit("\n", 1)[-1].strip()
    for layout in LAYOUTS:
        plain, with_context = (prompt_ids(tokenizer, layout, case, ctx) for ctx in (False, True))
        text = prompts.decode(tokenizer, plain)
        assert before in text
        assert case.truth.strip() not in text  # what the person has not written yet
        assert len(with_context) > len(plain)
        assert case.context[0].filename in prompts.decode(tokenizer, with_context)
