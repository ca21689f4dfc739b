"""Next-edit requests: windows, the edits a rewrite makes, the re-join stop rule and the
prompt layouts (no model but the tokenizer), then the rewrite on the default model."""

from __future__ import annotations

import pytest

from codespec import prompts
from codespec.errors import RequestError
from codespec.nextedit import rewrite
from codespec.nextedit.history import EditHistory
from codespec.nextedit.prompt import LAYOUTS, NextEditRequest, answer, build, proposed
from codespec.nextedit.rewrite import Edit, Window, completed, edits, rejoined_end

DOC = "".join(f"value_{i} = compute({i})\n" for i in range(30))


def apply(document: str, found: list[Edit]) -> str:
    for edit in sorted(found, key=lambda e: -e.start):
        document = document[: edit.start] + edit.text + document[edit.end:]
    return document


def test_the_window_is_whole_lines_around_the_cursor_clamped_to_the_document():
    window = Window.around(DOC, 15)
    assert (window.first, window.last) == (5, 26) and window.text.startswith("value_5 ")
    assert DOC[window.start:].startswith(window.text) and window.before + window.text + window.after == DOC
    assert (Window.around(DOC, 0).first, Window.around(DOC, 29).last) == (0, 30)
    assert Window.around("", 0).text == ""


def test_a_window_of_long_lines_is_cut_around_the_cursor(monkeypatch):
    monkeypatch.setattr(rewrite, "MAX_WINDOW_CHARS", 100)
    window = Window.around(DOC, 15)
    assert len(window.text) <= 100 and "value_15 " in window.text


@pytest.mark.parametrize("change", [
    lambda w: w.replace("compute(7)", "compute(7, cache=True)"),     # inside a line
    lambda w: w.replace("value_8 = compute(8)\n", ""),                 # a line deleted
    lambda w: w.replace("value_9 = compute(9)\n", "value_9 = compute(9)\nlog(value_9)\n"),  # inserted
    lambda w: w.replace("compute(6)", "fetch(6)").replace("compute(12)", "fetch(12)"),       # two places
])
def test_edits_turn_the_window_into_the_rewrite_and_are_small(change):
    window = Window.around(DOC, 10)
    new = change(window.text)
    found = edits(window, new)
    assert apply(DOC, found) == window.before + new + window.after
    assert sum(len(e.text) + e.end - e.start for e in found) < 40
    assert edits(window, window.text) == []


def test_the_rejoin_rule_ends_at_the_same_place_for_every_longer_output():
    window = "".join(f"line {i}\n" for i in range(12))
    output = window.replace("line 3\n", "LINE 3\n").replace("line 9\n", "LINE 9\n")
    rule = rejoined_end(window, rejoin=3)
    ends = {rule(output[:n]) for n in range(len(output) + 1)} - {None}
    first = len("".join(f"line {i}\n" for i in range(7)))  # LINE 3, then lines 4, 5, 6 copied
    assert ends == {(first, first)}
    assert rule(window) is None  # a copy never changed anything: no early end
    assert completed(window, output[:first]) == window.replace("line 3\n", "LINE 3\n")


def test_a_change_at_the_end_of_the_window_ends_it_there():
    window = "a\nb\nc\n"
    assert rejoined_end(window, rejoin=3)("a\nB\nc\n") == (6, 6)  # the window's last line copied


@pytest.fixture(scope="module")
def tokenizer():
    from codespec.models.loading import load_tokenizer
    from codespec.settings import Settings

    return load_tokenizer(Settings(), progress=False)


def history_of(before: str, after: str) -> list:
    h = EditHistory()
    h.update("m.py", before)
    h.update("m.py", after)
    return h.recent()


@pytest.mark.model
@pytest.mark.parametrize("layout", LAYOUTS)
def test_each_layout_shows_the_window_and_the_edits_with_markers_as_tokens(tokenizer, layout):
    text = DOC.replace("value_3 = compute(3)", "value_3 = compute(3)  # <|file_sep|> stays text")
    edited = text.replace("compute(10)", "fetch(10)")
    request = NextEditRequest("m.py", edited, edited.index("fetch(10)"), history_of(text, edited))
    prompt = build(layout, tokenizer, request)
    decoded = prompts.decode(tokenizer, prompt.ids) if layout != "instruct" else tokenizer.decode(prompt.ids)
    assert prompt.window.text in decoded.replace("<|user_cursor|>", "") and "fetch(10)" in decoded
    sep = prompts.special_id(tokenizer, prompts.FILE_SEP)
    if layout != "instruct":
        # the layout's separators are tokens; the document's `<|file_sep|>` string stays text
        assert prompt.ids.count(sep) == {"sweep": 4, "zeta": 2}[layout] and sep in prompt.end_ids
        assert "<|file_sep|> stays text" in tokenizer.decode(prompt.ids)
    with pytest.raises(RequestError, match="outside"):
        NextEditRequest("m.py", edited, len(edited) + 1)


@pytest.mark.model
def test_the_zeta_layout_keeps_a_few_hundred_tokens_of_context_in_a_long_file(tokenizer):
    # Zeta2 rewrites its region within ~350 tokens of context: not the whole file around it
    text = "".join(f"value_{i} = compute({i})\n" for i in range(2000))
    cursor = text.index("value_1000 =")
    prompt = build("zeta", tokenizer, NextEditRequest("m.py", text, cursor, history_of(text, text)))
    decoded = prompts.decode(tokenizer, prompt.ids)
    assert len(prompt.ids) < 1000, len(prompt.ids)  # digits are a token each: ~2 characters a token here
    assert "value_970 = " in decoded and "value_1020 = " in decoded and "value_900 = " not in decoded


def test_answers_are_taken_out_of_each_layout():
    assert answer("instruct", "Sure:\n```python\na = 1\n```\nDone.") == "a = 1\n"
    assert answer("zeta", "a<|user_cursor|> = 1\n") == "a = 1\n"
    assert answer("sweep", "a = 1\n```\n") == "a = 1\n"


def test_an_empty_answer_proposes_nothing(tokenizer):
    request = NextEditRequest("m.py", DOC, 10)
    prompt = build("sweep", tokenizer, request)
    assert proposed(prompt, "") == [] and proposed(prompt, prompt.window.text) == []


@pytest.mark.model
def test_the_rewrite_is_the_same_with_drafts_and_ends_where_it_rejoins(default_model):
    """The route's configuration (the window as the prediction, the re-join rule, the
    layout's stops and end tokens) on the default model: speculative output equals plain."""
    from codespec.engine.engine import Engine, GenerationConfig
    from codespec.nextedit.prompt import end_rule, stops
    from codespec.settings import Settings

    engine = Engine.from_settings(default_model.forward, default_model.tokenizer, Settings())
    before = "def scale(points, factor):\n    return [(x * factor, y * factor) for x, y in points]\n\n\n" \
             "small = scale(shape, 0.5)\nlarge = scale(shape, 2)\nhuge = scale(shape, 10)\n"
    after = before.replace("factor):", "factor, origin):")
    for layout in LAYOUTS:
        prompt = build(layout, engine.tokenizer, NextEditRequest("s.py", after, after.index("origin"),
                                                                 history_of(before, after)))
        window = tuple(prompts.encode(engine.tokenizer, prompt.window.text))
        outputs = [engine.generate(prompt.ids, GenerationConfig(
            len(window) + 64, stop=stops(prompt), end_at=end_rule(prompt), end_ids=prompt.end_ids,
            prediction=window, speculate=speculate)) for speculate in (False, True)]
        assert outputs[0].token_ids == outputs[1].token_ids, layout
        found = proposed(prompt, outputs[1].text)
        assert all(prompt.window.start <= e.start <= e.end <= prompt.window.start + len(prompt.window.text)
                   for e in found)
