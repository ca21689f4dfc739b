"""Editor-facing settings: `initializationOptions` and `workspace/didChangeConfiguration`.

Bad values never stop the server: each invalid field falls back to its default and the
user gets one message naming it.

>>> opts, problems = parse_options({"maxTokens": 64, "debounceMs": -5})
>>> opts.max_tokens, opts.debounce_ms, problems
(64, 40, ['debounceMs: Input should be greater than or equal to 0 (kept 40)'])
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel


class LspOptions(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True)

    enable: bool = Field(True, description="Offer inline completions.")
    max_tokens: int = Field(128, ge=1, le=1024, description="Most tokens one completion may generate.")
    # 768, not 1024 (the typing replay on a 2-core CPU): the first request in a
    # file 1.2 s instead of 1.5, and no first line lost (57% exact against 52%)
    prefix_tokens: int = Field(768, ge=16, le=16384, description="Tokens of the file before the cursor.")
    suffix_tokens: int = Field(256, ge=0, le=8192, description="Tokens of the file after the cursor.")
    latency_budget_ms: int = Field(250, ge=0, le=60000,
                                   description="Answer with the whole lines ready once this has passed since the "
                                   "request (the rest is generated on, for the next request); 0: always wait for "
                                   "the whole completion.")
    debounce_ms: int = Field(40, ge=0, le=2000, description="Wait before computing a completion the cache misses.")
    context_tokens: int = Field(
        0, ge=0, le=8192, description="Tokens of code from files worked on lately (the lines around where the "
        "person was in each) before the file's own window, in the model's repository layout; 0: none.")
    fim_layout: Literal["psm", "spm"] = Field(
        "spm", description="The prompt's order: 'spm' (the text after the cursor first, then the text before "
        "it: a new line re-reads only the prompt's end) or 'psm' (prefix, suffix, middle: each new line "
        "re-reads the suffix). `--server` sends llama.cpp's /infill request, whose layout is the server's.")
    multiline: bool = Field(True, description="Allow multi-line completions (to the end of the block).")
    index_workspace: bool = Field(True, description="Index the workspace folders on start-up.")


def parse_options(raw: Any) -> tuple[LspOptions, list[str]]:
    """Options from a client's JSON object (camelCase or snake_case keys)."""
    if raw is None:
        return LspOptions(), []
    if not isinstance(raw, dict):
        return LspOptions(), [f"codespec settings must be an object, got {type(raw).__name__}; using defaults"]
    if isinstance(raw.get("codespec"), dict):  # didChangeConfiguration sends {"codespec": {...}}
        raw = raw["codespec"]
    try:
        return LspOptions.model_validate(raw), []
    except ValidationError as exc:
        bad = {str(e["loc"][0]) for e in exc.errors() if e["loc"]}
        kept = {k: v for k, v in raw.items() if k not in bad}
        options = LspOptions.model_validate(kept)
        defaults = options.model_dump(by_alias=True)
        problems = [f"{e['loc'][0]}: {e['msg']} (kept {defaults.get(str(e['loc'][0]))})"
                    for e in exc.errors() if e["loc"]]
        return options, problems
