"""The one cut every suggestion goes through: `Landing.fit`, for the place it lands.

A suggestion is text inserted at a cursor. Wherever it comes from (generated for this
request, the rest of the one shown last, computed ahead after an accept, finished in the
background, streamed by `codespec serve`'s /infill), it is served only as `Landing.fit`
cuts it for the request it answers:

- **its block**: a single-line suggestion ends at its first newline; a multi-line one
  ends before the first line indented less than the block enclosing the cursor, or (in
  bracket languages) closing more than it opened. On a blank line that block starts at
  the cursor's column or, when deeper, at the next code line below: code inserted above
  a line indented 4 may not dedent below 4, since that line would then be an unexpected
  indent. After a line that opens a block, the block is its body; elsewhere the line's
  own level;
- **the suffix**: it ends before a line that is the first code line below the cursor's
  line, as written there: the generation met the text the file already holds;
- **its indentation and brackets** (`fit.fit_indent`, `fit.closed`), no last line that
  opens a block without its body (a cut at the line limit), no trailing blank lines, and
  nothing when only whitespace is left or it only repeats the lines below.

`Landing.end` is the streaming half: where the output ends, as soon as that is known,
so that a generation stops there (the engine's `GenerationConfig.end_at` for /infill, the
language server's `on_text`).

>>> text = "def f(rows):\\n    widths = {}\\n\\n    return widths\\n"
>>> blank = text.index("\\n\\n") + 1                       # column 0 of the blank line
>>> land = Landing.at(text, blank, "python")
>>> land.indent
4
>>> land.fit("    for r in rows:\\n        widths[r] = 1\\n\\ndef g():\\n    pass\\n")
'    for r in rows:\\n        widths[r] = 1'
>>> land.fit("    widths[0] = 1\\n    return widths\\n")   # meets the line below
'    widths[0] = 1'
>>> land.fit("def g():\\n    pass")                       # top-level code inside f
''
"""

from __future__ import annotations

from dataclasses import dataclass

from codespec.landing.fit import closed, fit_indent
from codespec.landing.syntax import BLOCK_OPENERS, CLOSERS, INDENTED, MAX_LINES, Mode, bracket_depth, classify, \
    indentation, repeats_following

COMMENT_STARTS = {"python": "#"}  # code lines below the cursor skip these (any indentation is legal)


@dataclass(frozen=True)
class Landing:
    """Where a suggestion lands: the document `text`, the cursor `offset`, the language;
    `mode`, `indent` and `meet` are derived by `Landing.at`."""

    text: str
    offset: int
    language_id: str
    mode: Mode
    indent: int  # lines after the first (and a first one on a blank line) stay at least this indented
    meet: str | None  # the suffix's first code line, right-stripped: the output ends before it
    lead: str | None  # the text before the cursor on its line when it is blank (the first line's indentation)
    blocks: bool = True  # False: only the suffix ends it (`Landing.meeting`)
    meet_any_indent: bool = False  # `meet` is the rest of the cursor's line: compared without indentation

    @classmethod
    def at(cls, text: str, offset: int, language_id: str, mode: Mode | None = None,
           indent: int | None = None) -> Landing:
        """The landing of a request at `offset`. `mode` defaults to `syntax.classify`'s;
        `indent`, to the block enclosing the cursor (a suggestion forwarded from an
        earlier request passes that request's mode and block)."""
        line_start = text.rfind("\n", 0, offset) + 1
        line_end = text.find("\n", offset)
        before, rest = text[line_start:offset], text[offset : len(text) if line_end < 0 else line_end].strip()
        mode = classify(text, offset, language_id) if mode is None else mode
        own = enclosing_indent(before) if indent is None else indent
        below = next_code_line(text, offset, language_id)
        limit = own if below is None else max(own, indentation(below))
        # the suffix's first code line: the rest of the cursor's line (closers the output
        # may write on a line of their own, at any indentation), else the next one
        meet, loose = (rest, True) if rest else (below, False)
        return cls(text, offset, language_id, mode, limit, meet, before if not before.strip() else None,
                   meet_any_indent=loose)

    @classmethod
    def meeting(cls, text: str, offset: int) -> Landing:
        """A fill-in-the-middle that ends only where it meets the suffix's first code line
        (an agent's `/v1/completions` with a `suffix`: no block rules)."""
        full = cls.at(text, offset, "", Mode.MULTI, 0)
        return cls(text, offset, "", Mode.MULTI, 0, full.meet, full.lead, blocks=False,
                   meet_any_indent=full.meet_any_indent)

    def end(self, output: str) -> tuple[int, int] | None:
        """Where `output` (the text after the cursor so far) ends, once that is known:
        (the end of the text served, how far the output must reach to know it), else
        None. A longer output ends at the same place (a line is judged on what it
        already holds), so speculative and plain decoding stop at the same token."""
        if self.mode is Mode.NONE:
            return 0, 0
        if self.mode is Mode.SINGLE:
            newline = output.find("\n")
            return None if newline < 0 else (newline, newline + 1)
        brackets = self.blocks and self.language_id not in INDENTED
        depth, at = 0, 0
        lines = output.split("\n")
        for i, line in enumerate(lines):
            complete = i < len(lines) - 1  # the last line may still grow
            whole = (self.lead or "") + line if i == 0 else line  # the line as the file will hold it
            judged = i > 0 or self.lead is not None  # a first line after typed text continues that text
            body = whole.lstrip(" \t")
            if i >= MAX_LINES and self.blocks:
                return at, at
            if judged and body and self.blocks and indentation(whole) < self.indent:  # known at its first character
                return at, at + len(line) - len(body) + 1
            if judged and complete and self.meets(whole):
                return at, at + len(line) + 1
            if brackets and complete:
                depth += bracket_depth(line)
                if depth < 0:  # closes the enclosing block: the file already has that line
                    return at, at + len(line) + 1
            at += len(line) + 1
        return None

    def meets(self, line: str) -> bool:
        """`line`, as the file would hold it, is the suffix's first code line."""
        if self.meet is None:
            return False
        return line.strip() == self.meet if self.meet_any_indent else line.rstrip() == self.meet

    def cut(self, output: str) -> tuple[str, bool]:
        """(the part of a streamed `output` to keep, whether the suggestion is finished)."""
        end = self.end(output)
        return (output, False) if end is None else (output[: end[0]], True)

    def trim(self, output: str) -> str:
        """The final text of a finished output, cut at its end and without trailing blank
        lines; "" when only whitespace is left (what `/infill` serves)."""
        end = self.end(output if self.mode is Mode.SINGLE else output + "\n")  # its last line is complete now
        kept = output if end is None else output[: end[0]]
        if self.mode is Mode.MULTI:
            kept = without_trailing_blank_lines(kept)
        return kept if kept.strip() else ""

    def fit(self, completion: str) -> str:
        """The suggestion to serve for `completion` here (see the module docstring); ""
        for none."""
        kept = self.trim(completion)
        kept = self.trim(fit_indent(closed(kept), self.text, self.offset, self.language_id))
        if self.mode is Mode.MULTI:
            kept = without_open_header(kept)
        if not kept or repeats_following(kept, self.text, self.offset):
            return ""
        return kept


def enclosing_indent(before: str) -> int:
    """The smallest indentation of the block a suggestion after `before` (the cursor's
    line up to the cursor) stays in: the cursor's column on a blank line, the body of a
    line that opens a block, else the line's own level."""
    if not before.strip():
        return indentation(before)
    if before.rstrip().endswith(BLOCK_OPENERS):
        return indentation(before) + 1
    return indentation(before)


def next_code_line(text: str, offset: int, language_id: str) -> str | None:
    """The first line below the cursor's line that holds code (not blank, not a comment),
    right-stripped; None at the end of the file."""
    comment = COMMENT_STARTS.get(language_id)
    start = text.find("\n", offset) + 1
    while start > 0:  # line by line, not a split of the whole rest of the file per request
        end = text.find("\n", start)
        line = text[start : len(text) if end < 0 else end]
        body = line.strip()
        if body and not (comment and body.startswith(comment)):
            return line.rstrip()
        start = end + 1
    return None


def without_trailing_blank_lines(text: str) -> str:
    """`text` without the whitespace that ends it when that whitespace holds a newline:
    blank lines after the last code line would be inserted before the file's own."""
    stripped = text.rstrip()
    return stripped if "\n" in text[len(stripped) :] else text


def without_open_header(text: str) -> str:
    """`text` without last lines that open a block whose body it does not hold (a cut
    after `while True:`): the body is what the file below would then get.

    >>> without_open_header("x = 1\\nwhile True:\\n")
    'x = 1'
    """
    lines = text.rstrip().split("\n")
    kept = len(lines)
    while kept and lines[kept - 1].rstrip().endswith(":"):
        kept -= 1
    return text if kept == len(lines) else "\n".join(lines[:kept]).rstrip()


def infill_mode(text: str, offset: int) -> Mode:
    """/infill's mode: one line when text other than closers follows the cursor on its
    line, else a block (llama.vim asks at the end of any line and cuts with `n_indent`)."""
    line_end = text.find("\n", offset)
    after = text[offset : len(text) if line_end < 0 else line_end].strip(" \t\r")
    return Mode.SINGLE if after and after[0] not in CLOSERS else Mode.MULTI
