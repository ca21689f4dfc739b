"""POST /v1/next_edit: the edit the model predicts after the recent ones (nextedit/);
and POST /backend/next_edit_autocomplete, Sweep's local next-edit server's route.

The model rewrites a window of whole lines around the cursor in the request's layout;
the answer is the smallest edits that turn the window into the rewrite (none when it is
unchanged), as offsets and as line/character positions (code points). The window is
the request's prediction, so drafts follow it and re-join it after each change; the
rewrite ends once it re-joined the window for a few lines after a change.

Sweep's route answers as `sweep-autocomplete` does: one NDJSON line with the character
range to replace (`start_index`, `end_index`, code points) and its `completion`, the
rewrite's changes merged into one span; `0, 0, ""` for none.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from codespec import prompts
from codespec.engine.run import Generation, GenerationConfig
from codespec.nextedit.history import Change, parse_changes
from codespec.nextedit.prompt import NextEditRequest as Asked
from codespec.nextedit.prompt import layout_for, planned, proposed
from codespec.nextedit.rewrite import merged, position
from codespec.server.responses import AnyBackend, backend, unless_client_leaves
from codespec.server.schemas import NextEditRequest, SweepNextEditRequest

router = APIRouter()


@router.post("/v1/next_edit")
async def next_edit(req: NextEditRequest, request: Request, b: AnyBackend = Depends(backend)) -> Any:
    b.check_prompt_size(req.text, *(e.before + e.after for e in req.recent_edits))
    history = [Change(e.path, e.start_line, e.before, e.after) for e in req.recent_edits]
    layout = req.layout or layout_for(b.settings.next_edit_layout, b.settings.model)
    answer = await _predict(b, request, Asked(req.path, req.text, req.offset(), history), layout)
    if not isinstance(answer, tuple):
        return answer
    found, prompt, g = answer
    return {"edits": [{"start": e.start, "end": e.end, "text": e.text,
                       "range": {"start": _position(req.text, e.start), "end": _position(req.text, e.end)}}
                      for e in found],
            "window": {"start_line": prompt.window.first, "end_line": prompt.window.last},
            "layout": layout, "codespec": g.stats.to_json()}


@router.post("/backend/next_edit_autocomplete")
async def sweep_next_edit(req: SweepNextEditRequest, request: Request, b: AnyBackend = Depends(backend)) -> Any:
    began = time.perf_counter()
    b.check_prompt_size(req.file_contents, req.recent_changes)
    related = [prompts.ExtraFile(c.file_path, c.content) for c in (*req.file_chunks, *req.retrieval_chunks)]
    asked = Asked(req.file_path, req.file_contents, req.offset(), parse_changes(req.recent_changes, req.file_path),
                  related)
    answer = await _predict(b, request, asked, layout_for(b.settings.next_edit_layout, b.settings.model))
    if not isinstance(answer, tuple):
        return answer
    found, _, g = answer
    start, end, text = merged(req.file_contents, found)
    result = {"start_index": start, "end_index": end, "completion": text, "confidence": 1.0 if found else 0.0,
              "autocomplete_id": uuid.uuid4().hex, "logprobs": None, "finish_reason": g.finish_reason,
              "elapsed_time_ms": int((time.perf_counter() - began) * 1000)}
    if req.multiple_suggestions:
        result["completions"] = [{k: result[k] for k in ("start_index", "end_index", "completion", "confidence",
                                                          "autocomplete_id")}] if found else []
    return Response(json.dumps(result) + "\n", media_type="application/x-ndjson")


async def _predict(b: AnyBackend, request: Request, asked: Asked, layout: str) -> Any:
    """The model's rewrite of the request's window and the edits it makes: (edits,
    prompt, generation), or the response a client that left gets."""
    prompt, fields = await run_in_threadpool(planned, layout, b.tokenizer, asked)
    config = GenerationConfig(**fields)
    b.check_request(prompt.ids, config.max_new_tokens, config.prediction)
    g = await unless_client_leaves(request, b.complete(prompt.ids, config))
    if not isinstance(g, Generation):
        return g
    return proposed(prompt, g.text), prompt, g


def _position(text: str, offset: int) -> dict[str, int]:
    line, character = position(text, offset)
    return {"line": line, "character": character}
