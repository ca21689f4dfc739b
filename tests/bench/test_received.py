"""`codespec bench quality --received`: the cases as an editor's replay, and the answers
scored as shown (the servers run in the suite itself)."""

from __future__ import annotations

from codespec.bench import received
from codespec.bench.editor import Sample, SystemResult
from codespec.bench.quality import Case
from codespec.bench.typing import Ask, Close, Open


def _cases() -> list[Case]:
    return [Case("p/f.py:1", "line", "f.py", "x = \n", 4, "compute(a)", ()),
            Case("p/g.py:2", "block", "g.py", "def f():\n\n", 9, "    return 1\n", ())]


def test_each_case_is_a_file_opened_asked_once_at_its_cursor_and_closed():
    events = received.replay_of(_cases()).events
    assert [type(e) for e in events] == [Open, Ask, Close] * 2
    first, second = events[1], events[4]
    assert first.path == "case00/f.py" and (first.line, first.character) == (0, 4) and first.first
    assert second.path == "case01/g.py" and (second.line, second.character) == (1, 0) and not second.first
    assert second.truth == "    return 1\n" and events[3].text == "def f():\n\n"


def test_answers_score_as_shown_and_a_missing_one_as_empty():
    def sample(text, latency):
        return Sample("mid-line", False, latency, False, 0, text=text)

    lsp = SystemResult("lsp", [sample("compute(a)", 0.4), sample("    return 1\n    pass\n", 0.6)])
    peer = SystemResult("llama-server", [sample("compute(b)", 0.3), sample(None, None)])
    off = SystemResult("other", skipped="not installed")
    facts = received.summary(_cases(), [lsp, peer, off])
    assert facts["lsp"]["line"]["exact"] == 1.0 and facts["lsp"]["block"]["exact"] == 1.0
    assert facts["llama-server"]["line"]["exact"] == 0.0 and facts["llama-server"]["line"]["similarity"] > 0.8
    assert facts["llama-server"]["block"] == {"exact": 0.0, "similarity": 0.0, "cases": 1, "shown": 0.0,
                                              "latency_p50_s": None}
    assert facts["other"] == {"skipped": "not installed"}
