"""POST /v1/next_edit on the default model: edits with offsets and positions, and the
400s for a cursor outside the text or an unknown layout."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.model, pytest.mark.anyio]

BEFORE = "def scale(points, factor):\n    return [(x * factor, y * factor) for x, y in points]\n\n\n" \
         "small = scale(shape, 0.5)\nlarge = scale(shape, 2)\n"
AFTER = BEFORE.replace("factor):", "factor, origin):")


async def test_a_next_edit_answers_edits_inside_the_window(http):
    body = {"path": "s.py", "text": AFTER, "position": {"line": 0, "character": 25},
            "recent_edits": [{"path": "s.py", "start_line": 0, "before": BEFORE.splitlines(True)[0],
                              "after": AFTER.splitlines(True)[0]}]}
    answer = (await http.post("/v1/next_edit", json=body)).json()
    assert answer["layout"] == "instruct" and answer["window"] == {"start_line": 0, "end_line": 6}
    for edit in answer["edits"]:
        assert 0 <= edit["start"] <= edit["end"] <= len(AFTER)
        lines = AFTER.split("\n")
        start = edit["range"]["start"]
        assert sum(len(x) + 1 for x in lines[: start["line"]]) + start["character"] == edit["start"]
    assert answer["codespec"]["generated_tokens"] > 0


@pytest.mark.parametrize("extra, message", [
    ({"cursor": 10_000}, "outside the text"),
    ({"position": {"line": 40, "character": 0}}, "outside the text"),
    ({"cursor": 3, "layout": "mystery"}, "layout"),
    ({}, "give the cursor"),
])
async def test_bad_next_edit_requests_get_a_400(http, extra, message):
    response = await http.post("/v1/next_edit", json={"text": AFTER, **extra})
    assert response.status_code == 400 and message in response.text


async def test_sweeps_route_answers_one_range_in_code_points(http):
    text = "# café ☕\n" + AFTER  # characters outside the BMP count two UTF-16 units in the cursor
    cursor = len(text[: text.index("origin")].encode("utf-16-le")) // 2
    body = {"file_path": "s.py", "file_contents": text, "cursor_position": cursor, "multiple_suggestions": True,
            "recent_changes": "File: s.py\n@@ -2,1 +2,1 @@\n-def scale(points, factor):\n"
                              "+def scale(points, factor, origin):\n",
            "file_chunks": [], "retrieval_chunks": [], "recent_user_actions": [], "editor_diagnostics": []}
    response = await http.post("/backend/next_edit_autocomplete", json=body)
    assert response.status_code == 200 and response.headers["content-type"].startswith("application/x-ndjson")
    (line,) = response.text.splitlines()
    import json

    answer = json.loads(line)
    assert {"start_index", "end_index", "completion", "confidence", "autocomplete_id", "elapsed_time_ms",
            "completions"} <= set(answer)
    assert 0 <= answer["start_index"] <= answer["end_index"] <= len(text)
