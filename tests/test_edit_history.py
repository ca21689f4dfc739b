"""A document's recent edits for next-edit requests: keystrokes coalesced into hunks,
bounded, in order (no model)."""

from __future__ import annotations

from codespec.nextedit import history
from codespec.nextedit.history import EditHistory

CODE = "".join(f"line{i} = {i}\n" for i in range(40))


def typed(h: EditHistory, uri: str, text: str, at: int, what: str) -> str:
    """`what` typed into `text` at character `at`, one keystroke at a time."""
    for i in range(len(what)):
        h.update(uri, text[:at] + what[: i + 1] + text[at:])
    return text[:at] + what + text[at:]


def test_keystrokes_on_nearby_lines_are_one_hunk_and_a_far_edit_another():
    h = EditHistory()
    h.update("a.py", CODE)
    text = typed(h, "a.py", CODE, CODE.index("line5 ="), "new_")
    text = typed(h, "a.py", text, text.index("line6 ="), "new_")
    (edit,) = h.recent("a.py")
    assert (edit.start, edit.before, edit.after) == (5, "line5 = 5\nline6 = 6\n", "new_line5 = 5\nnew_line6 = 6\n")
    text = typed(h, "a.py", text, text.index("line30 ="), "x")
    first, second = h.recent("a.py")
    assert first == edit and (second.start, second.after) == (30, "xline30 = 30\n")


def test_lines_inserted_above_move_the_open_hunk():
    h = EditHistory()
    h.update("a.py", CODE)
    text = typed(h, "a.py", CODE, CODE.index("line20 ="), "y")
    text = "import os\nimport sys\n" + text  # far above: closes the hunk, opens one at the top
    h.update("a.py", text)
    text = text.replace("line21 = 21", "line21 = 0")  # next to the first hunk, two lines down now
    h.update("a.py", text)
    starts = [(e.start, e.after) for e in h.recent("a.py")]
    assert starts == [(20, "yline20 = 20\n"), (0, "import os\nimport sys\n"), (23, "line21 = 0\n")]


def test_another_document_closes_the_open_hunk_and_taking_back_leaves_nothing():
    h = EditHistory()
    h.update("a.py", CODE)
    h.update("b.py", CODE)
    typed(h, "a.py", CODE, 0, "z")
    typed(h, "b.py", CODE, 0, "q")
    assert [e.uri for e in h.recent()] == ["a.py", "b.py"]
    h.update("b.py", CODE)  # undone
    assert [e.uri for e in h.recent()] == ["a.py"]


def test_history_is_bounded_per_document_and_in_all(monkeypatch):
    monkeypatch.setattr(history, "PER_DOCUMENT", 2)
    monkeypatch.setattr(history, "TOTAL", 3)
    h = EditHistory()
    for uri in ("a.py", "b.py"):
        h.update(uri, CODE)
        text = CODE
        for line in (0, 10, 20, 30):
            text = text.replace(f"line{line} =", f"v{line} =")
            h.update(uri, text)
    kept = [(e.uri, e.start) for e in h.recent()]
    assert kept == [("a.py", 30), ("b.py", 10), ("b.py", 20), ("b.py", 30)]  # 3 closed, b's open hunk last


def test_sides_are_cut_and_huge_documents_are_not_compared(monkeypatch):
    h = EditHistory()
    h.update("a.py", CODE)
    h.update("a.py", "")
    assert h.recent()[0].before.count("\n") == history.MAX_LINES
    monkeypatch.setattr(history, "MAX_DOCUMENT_CHARS", 10)
    h.update("big.py", CODE)
    h.update("big.py", CODE + "x")
    assert [e.uri for e in h.recent()] == ["a.py"]


def test_changes_are_read_from_diff_text_as_clients_send_it():
    from codespec.nextedit.history import parse_changes

    sweep = "File: pkg/a.py\n@@ -3,2 +3,2 @@\n x = 1\n-y = x\n+y = x + 1\nFile: b.py\n@@ -1 +1 @@\n-old\n+new\n"
    found = [(c.uri, c.start, c.before, c.after) for c in parse_changes(sweep)]
    assert found == [("pkg/a.py", 2, "x = 1\ny = x\n", "x = 1\ny = x + 1\n"), ("b.py", 0, "old\n", "new\n")]
    unified = "--- a/c.py\n+++ b/c.py\n@@ -10,1 +10,2 @@\n-f()\n+f()\n+g()\n@@ -20,1 +21,0 @@\n-h()\n"
    assert [(c.uri, c.start) for c in parse_changes(unified)] == [("c.py", 9), ("c.py", 19)]
    assert parse_changes("not a diff") == []
