"""Next-edit prompts: the recent edits, the file around the cursor and the window the
model rewrites, in the layout of the model that answers.

    sweep     Sweep's next-edit models (sweepai/sweep-next-edit-*): Qwen2.5-Coder's file
              separators, the recent edits as `original:`/`updated:` blocks, then the
              window as it was before the last edit (`original/`), as it is
              (`current/`), and `updated/`, after which the model writes the window again
    zeta      Zed's Zeta2 layout: the edit history as unified diffs, the file as a FIM
              prompt whose middle is the window (`current`), answered after `updated`
    instruct  a chat turn for an instruct model (the default one): the diffs, the window
              in a fenced block, and the ask to write it again with the next edit

Every layout's answer is the window rewritten; `answer` takes it out of the model's text
(the chat's code fence, Zeta's cursor marker).

    prompt = build("sweep", tokenizer, NextEditRequest("app.py", text, cursor, history))
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from codespec import prompts
from codespec.errors import RequestError
from codespec.nextedit.history import Change
from codespec.nextedit.rewrite import Window, completed, edits, rejoined_end

LAYOUTS = ("sweep", "zeta", "instruct")
DEFAULT_LAYOUT = "instruct"  # the default instruct model's (docs/next-edit.md: the layouts measured)
ROOM = 64  # tokens the rewrite may run past the window's length
MAX_EDITS = 3  # recent edits shown (Sweep shows three)
# Zeta2 edits its region within ~350 tokens of context: the file's text around the window
# is cut to whole lines within these (~4 characters a token)
ZETA_BEFORE_CHARS, ZETA_AFTER_CHARS = 800, 400
CURSOR = "<|user_cursor|>"  # Zeta's cursor marker (plain text to Qwen's tokenizer)
FENCE = "```"
# The ask comes first: it is the same in every request, so a server's prompt cache holds
# it, and only the code from the edited line on and the changes are computed anew
INSTRUCTION = ("Below are lines of a file I am editing and my last changes. Make the same change wherever else "
               "those lines need it (a renamed name at its other uses, the same edit on similar lines), and nothing "
               "else. Reply with all the lines, rewritten, in one code block; if nothing else needs to change, "
               "reply with them unchanged.")


@dataclass(frozen=True)
class NextEditRequest:
    path: str
    document: str
    cursor: int  # an offset into the document
    history: Sequence[Change] = ()  # oldest first; their `uri`s are paths as shown
    related: Sequence[prompts.ExtraFile] = field(default_factory=tuple)  # other files' text

    def __post_init__(self) -> None:
        if not 0 <= self.cursor <= len(self.document):
            raise RequestError(f"cursor {self.cursor} is outside the document ({len(self.document)} characters)")


@dataclass(frozen=True)
class Prompt:
    ids: list[int]
    window: Window
    layout: str
    end_ids: frozenset[int]  # tokens after which the rewrite is over (besides EOS)


def layout_for(setting: str, model: str) -> str:
    """The layout of next-edit requests that name none: `setting` (Settings.next_edit_layout)
    unless 'auto', then the one of the model family `model` (a path or a name) belongs to.

    >>> layout_for("auto", "sweepai/sweep-next-edit-1.5B"), layout_for("auto", "/m/zeta-2"), layout_for("auto", "default")
    ('sweep', 'zeta', 'instruct')
    """
    if setting != "auto":
        return setting
    name = model.rstrip("/").rsplit("/", 1)[-1].lower()
    return "sweep" if "sweep" in name else "zeta" if "zeta" in name else DEFAULT_LAYOUT


def build(layout: str, tokenizer: Any, request: NextEditRequest) -> Prompt:
    """The request's prompt in `layout` (one of LAYOUTS)."""
    if layout not in LAYOUTS:
        raise RequestError(f"layout {layout!r} is not one of {', '.join(LAYOUTS)}")
    line = request.document.count("\n", 0, request.cursor)
    window = Window.around(request.document, line)
    history = list(request.history)[-MAX_EDITS:]
    if layout == "instruct":
        return Prompt(prompts.chat_ids(tokenizer, [{"role": "user", "content": _instruct(request, window, history)}]),
                      window, layout, frozenset())
    marks = {name: _token(tokenizer, name) for name in (prompts.FILE_SEP, prompts.FIM_PREFIX, prompts.FIM_SUFFIX,
                                                         prompts.FIM_MIDDLE)}
    parts = _sweep(request, window, history) if layout == "sweep" else _zeta(request, window, history)
    # markers as their tokens, everything else (code, paths, diffs) as text
    texts = [part for part in parts if part not in marks]
    encoded = iter(prompts.encode_texts(tokenizer, texts))
    ids = [token for part in parts for token in ([marks[part]] if part in marks else next(encoded))]
    return Prompt(ids, window, layout, frozenset({marks[prompts.FILE_SEP]} | prompts.fim_end_ids(tokenizer)))


def end_rule(prompt: Prompt) -> Any:
    """`GenerationConfig.end_at` for the prompt: the rewrite ends once it re-joined the
    window after a change (rewrite.rejoined_end), counted from the answer's first line
    (after the chat's opening fence)."""
    rule = rejoined_end(prompt.window.text)
    if prompt.layout != "instruct":
        return rule

    def end_at(raw: str) -> tuple[int, int] | None:
        start = raw.find(FENCE)
        body = raw.find("\n", start) + 1 if start >= 0 else 0
        if start < 0 or body == 0:
            return None
        found = rule(raw[body:])
        return None if found is None else (found[0] + body, found[1] + body)

    return end_at


def planned(layout: str, tokenizer: Any, request: NextEditRequest) -> tuple[Prompt, dict[str, Any]]:
    """The request's prompt in `layout` and its rewrite's GenerationConfig fields."""
    prompt = build(layout, tokenizer, request)
    return prompt, generation(prompt, prompts.encode(tokenizer, prompt.window.text))


def generation(prompt: Prompt, window_ids: Sequence[int]) -> dict[str, Any]:
    """The rewrite's GenerationConfig fields: room for the window and a little more, the
    layout's stops and end tokens, the re-join rule, and the window as the prediction
    (drafts follow it)."""
    return {"max_new_tokens": len(window_ids) + ROOM, "stop": stops(prompt), "end_at": end_rule(prompt),
            "end_ids": prompt.end_ids, "prediction": tuple(window_ids)}


def stops(prompt: Prompt) -> tuple[str, ...]:
    """Stop strings: the chat's closing fence."""
    return ("\n" + FENCE,) if prompt.layout == "instruct" else ()


def proposed(prompt: Prompt, output: str) -> list[Any]:
    """The edits the model's output proposes: its rewrite (completed where the rule ended
    it) against the window; none for an empty answer (the model gave up at once, which
    is no reason to delete the window)."""
    rewrite = answer(prompt.layout, output)
    if not rewrite.strip() or not resembles(prompt.window.text, rewrite):
        return []
    if not rewrite.endswith("\n") and prompt.window.text.endswith("\n"):
        rewrite += "\n"  # the closing fence's line end was cut with it
    return edits(prompt.window, completed(prompt.window.text, rewrite))


def resembles(window: str, rewrite: str) -> bool:
    """Whether `rewrite` is a rewrite of the window (at least half of its lines are the
    window's), not something else the model wrote (a diff, an explanation)."""
    lines = rewrite.splitlines()
    if not lines:
        return False
    known = set(window.splitlines())
    return sum(line in known for line in lines) * 2 >= len(lines)


def answer(layout: str, text: str) -> str:
    """The rewritten window in a model's answer (a chat model's fence around it, or after
    it where the layout has none, and Zeta's cursor marker taken out)."""
    if layout == "zeta":
        return text.replace(CURSOR, "")
    if layout == "sweep":
        end = text.find("\n" + FENCE)
        return text if end < 0 else text[: end + 1]
    if layout == "instruct":
        start = text.find(FENCE)
        if start < 0:
            return text
        body = text[text.find("\n", start) + 1:] if "\n" in text[start:] else ""
        end = body.find(FENCE)
        return body if end < 0 else body[:end]
    return text


def _original(window: Window, history: Sequence[Change]) -> str:
    """The window as it read before the last edit (Sweep's `original/` block), where that
    edit lies inside it; else the window as it is."""
    if not history:
        return window.text
    last = history[-1]
    lines = window.text.splitlines(keepends=True)
    after = last.after.splitlines(keepends=True)
    at = last.start - window.first
    if at < 0 or at + len(after) > len(lines) or lines[at: at + len(after)] != after:
        return window.text
    return "".join(lines[:at]) + last.before + "".join(lines[at + len(after):])


def _sweep(request: NextEditRequest, window: Window, history: Sequence[Change]) -> list[str]:
    sep = prompts.FILE_SEP
    parts: list[str] = []
    for extra in request.related:
        parts += [sep, _line_end(f"{extra.filename}\n{extra.text}")]
    for edit in history:
        parts += [sep, f"{edit.uri}.diff\noriginal:\n{_line_end(edit.before)}updated:\n{_line_end(edit.after)}"]
    parts += [sep, _line_end(f"original/{request.path}\n{_original(window, history)}"),
              sep, _line_end(f"current/{request.path}\n{window.text}"), sep, f"updated/{request.path}\n"]
    return parts


def _zeta(request: NextEditRequest, window: Window, history: Sequence[Change]) -> list[str]:
    diffs = "\n".join(edit.diff(edit.uri) for edit in history)
    cursor = request.cursor - window.start
    marked = window.text[:cursor] + CURSOR + window.text[cursor:] if 0 <= cursor <= len(window.text) else window.text
    parts: list[str] = []
    for extra in request.related:
        parts += [prompts.FILE_SEP, _line_end(f"{extra.filename}\n{extra.text}")]
    before, after = _lines_within(window.before, ZETA_BEFORE_CHARS, last=True), _lines_within(window.after,
                                                                                               ZETA_AFTER_CHARS)
    return parts + [prompts.FILE_SEP, f"edit history\n{diffs}\n", prompts.FILE_SEP, f"{request.path}\n",
                    prompts.FIM_PREFIX, f"\n{before}", prompts.FIM_MIDDLE, f"current\n{marked}",
                    prompts.FIM_SUFFIX, f"\n{after}", prompts.FIM_MIDDLE, "updated\n"]


def _lines_within(text: str, chars: int, last: bool = False) -> str:
    """The whole lines of `text` that fit in `chars` characters: its first ones, or its last."""
    if len(text) <= chars:
        return text
    if last:
        cut = text.find("\n", len(text) - chars)
        return text[cut + 1:] if cut >= 0 else ""
    cut = text.rfind("\n", 0, chars)
    return text[: cut + 1]


def _line_end(text: str) -> str:
    return text if not text or text.endswith("\n") else text + "\n"


def _instruct(request: NextEditRequest, window: Window, history: Sequence[Change]) -> str:
    changes = "\n".join(_described(change) for change in history) or "(no changes yet)"
    return (f"{INSTRUCTION}\n\nLines {window.first + 1}-{window.last} of {request.path}:\n"
            f"{FENCE}\n{window.text}{FENCE}\n\nMy last changes:\n{changes}")


def _described(change: Change) -> str:
    """One recent change in words and code: what its lines read, and what they read now."""
    before, after = change.before.rstrip("\n"), change.after.rstrip("\n")
    if not before:
        return f"- added to {change.uri}:\n{FENCE}\n{after}\n{FENCE}"
    if not after:
        return f"- removed from {change.uri}:\n{FENCE}\n{before}\n{FENCE}"
    return f"- in {change.uri}, changed\n{FENCE}\n{before}\n{FENCE}\n  to\n{FENCE}\n{after}\n{FENCE}"


def _token(tokenizer: Any, marker: str) -> int:
    found = prompts.special_id(tokenizer, marker)
    if found is None:
        raise RequestError(f"this model's tokenizer has no {marker} token: use layout \"instruct\"")
    return found
