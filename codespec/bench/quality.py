"""`codespec bench quality`: whether a completion is right, not how fast it comes.

With greedy output identical to plain decoding, a completion's quality is the model's
and the prompt's: which context goes in, and in which layout. Cases come from files of
standard-library packages no other request set uses; each is a cursor in a function and
the text that truly follows it:

    line   the cursor after the first `(`, ` = ` or `return ` of a line in a function
           body: the rest of the line follows
    block  the cursor at the start of a line in a function body: the function's next
           lines (up to four) follow

The document each case shows is the file without that text, as it reads before the
person writes it. Each case is asked in every layout, without and with repository context (the package's
files the target imports from, or its siblings, cut to `CONTEXT_CHARS`):

    codespec   the language server's own prompt (lsp/window.py: its windows before and
               after the cursor, the suffix first, other files in the repository layout)
    llama.vim  llama.vim's request as llama-server builds it: 256 lines before the
               cursor's line and the typed part of it as the prefix, the rest of the line
               and 64 lines after as the suffix, the prefix first; context as `input_extra`
    repo       Qwen2.5-Coder's repository layout, no fill-in-the-middle: <|repo_name|>,
               each file after <|file_sep|> and its path, the target file's text up to
               the cursor last (its trailing spaces held back); the model continues it

Scored by exact match (a line: the rest of the line, spaces around it ignored; a block:
every line, trailing spaces ignored) and edit similarity (rapidfuzz's normalized
Levenshtein similarity over the same text).
"""

from __future__ import annotations

import ast
import importlib.util
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from codespec import prompts
from codespec.bench.request_sets import functions

# package -> target files; none of these packages is used by another request set
TARGETS: dict[str, tuple[str, ...]] = {
    "concurrent.futures": ("process.py", "thread.py"),
    "multiprocessing": ("pool.py", "managers.py"),
    "wsgiref": ("handlers.py", "validate.py"),
    "zoneinfo": ("_zoneinfo.py",),
    "tomllib": ("_parser.py",),
    "importlib.metadata": ("__init__.py",),
}
KINDS = ("line", "block")
LAYOUTS = ("codespec", "llama.vim", "repo")
PER_FILE = 3  # cases of each kind per target file
BLOCK_LINES = 4
CONTEXT_CHARS = 2400  # repository context, in all
LLAMA_VIM_PREFIX_LINES, LLAMA_VIM_SUFFIX_LINES = 256, 64


@dataclass(frozen=True)
class Case:
    name: str  # package/file:line
    kind: str
    path: str  # the file's path in its package
    text: str  # the file without the truth
    offset: int  # the cursor
    truth: str  # what the person writes there
    context: tuple[prompts.ExtraFile, ...]


def cases(per_file: int = PER_FILE) -> list[Case]:
    """`per_file` cases of each kind per target file, spread over its functions."""
    found: list[Case] = []
    for package, files in TARGETS.items():
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.origin:
            continue
        folder = Path(spec.origin).parent
        for name in files:
            source = (folder / name).read_text(encoding="utf-8")
            context = _context(folder, name, source)
            for kind in KINDS:
                candidates = list(_line_cases(source) if kind == "line" else _block_cases(source))
                step = max(1, len(candidates) // per_file)
                for offset, truth in candidates[::step][:per_file]:
                    line = source.count("\n", 0, offset) + 1
                    # the document as it is before the person writes the truth: without it
                    document = source[:offset] + source[offset + len(truth):]
                    found.append(Case(f"{package}/{name}:{line}", kind, name, document, offset, truth, context))
    return found


def _body_lines(source: str) -> list[tuple[int, int]]:
    """(line number, end line of its function) of every line inside a function body."""
    out = []
    for fn in functions(ast.parse(source)):
        first = fn.body[0].lineno
        if isinstance(fn.body[0], ast.Expr) and isinstance(getattr(fn.body[0], "value", None), ast.Constant):
            first = fn.body[0].end_lineno + 1 if len(fn.body) > 1 else fn.end_lineno + 1  # past the docstring
        out += [(n, fn.end_lineno or n) for n in range(first, (fn.end_lineno or first) + 1)]
    return sorted(set(out))


def _lines(source: str) -> tuple[list[str], list[int]]:
    """The source's lines (with their ends) and the offset where each starts."""
    lines = source.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))
    return lines, starts


def _line_cases(source: str) -> list[tuple[int, str]]:
    lines, starts = _lines(source)
    out = []
    for number, _ in _body_lines(source):
        line = lines[number - 1].rstrip("\n")
        code = line.strip()
        if code.startswith("#") or not 24 <= len(code) <= 100:
            continue
        cut = min((line.find(mark) + len(mark) for mark in ("(", " = ", "return ") if mark in line), default=-1)
        truth = line[cut:]
        if cut < 0 or len(truth.strip()) < 8 or line[:cut].strip() == "":
            continue
        out.append((starts[number - 1] + cut, truth))
    return out


def _block_cases(source: str) -> list[tuple[int, str]]:
    lines, starts = _lines(source)
    out = []
    for number, end in _body_lines(source):
        if end - number + 1 < 2 or not lines[number - 1].strip() or lines[number - 1].strip().startswith("#"):
            continue
        if number > 1 and lines[number - 2].rstrip().endswith(("\\", ",", "(")):
            continue  # the line continues a statement
        follow = lines[number - 1: min(end, number - 1 + BLOCK_LINES)]
        out.append((starts[number - 1], "".join(follow)))
    return out


def _context(folder: Path, name: str, source: str) -> tuple[prompts.ExtraFile, ...]:
    """The package's files `name` imports from (else its siblings), each cut to its share
    of CONTEXT_CHARS: their heads (imports, the first definitions)."""
    imported = re.findall(r"^from \.(\w+) import", source, re.M) + re.findall(r"^from \. import (\w+)", source, re.M)
    siblings = sorted(p.stem for p in folder.glob("*.py") if p.name != name and p.stem != "__init__")
    chosen = [m for m in dict.fromkeys(imported) if (folder / f"{m}.py").is_file() and m != Path(name).stem][:2] \
        or siblings[:2]
    share = CONTEXT_CHARS // max(1, len(chosen))
    return tuple(prompts.ExtraFile(f"{m}.py", (folder / f"{m}.py").read_text(encoding="utf-8")[:share])
                 for m in chosen)


def prompt_ids(tokenizer: Any, layout: str, case: Case, with_context: bool) -> list[int]:
    """The case's prompt in `layout`."""
    extra = case.context if with_context else ()
    before, after = case.text[: case.offset], case.text[case.offset:]
    if layout == "codespec":
        from codespec.lsp.options import LspOptions
        from codespec.lsp.window import fim_request

        request, held = fim_request(case.text, case.offset, LspOptions(), case.path, tuple(extra))
        return prompts.fim_ids(tokenizer, request.prefix, request.suffix, request.middle, extra=request.extra,
                               prefix_tokens=request.prefix_tokens, suffix_tokens=request.suffix_tokens,
                               layout=request.layout, path=request.path)
    if layout == "llama.vim":
        head, _, typed = before.rpartition("\n")
        lines = head.split("\n") if head else []
        prefix = "".join(f"{x}\n" for x in lines[-LLAMA_VIM_PREFIX_LINES:])
        rest, _, below = after.partition("\n")
        suffix = rest + "\n" + "".join(f"{x}\n" for x in below.split("\n")[:LLAMA_VIM_SUFFIX_LINES])
        # llama-server: the repository tokens around input_extra, the typed part after the prefix
        return prompts.fim_ids(tokenizer, prefix + typed, suffix, extra=extra, layout="psm", repo_name="myproject")
    if layout == "repo":
        repo, sep = prompts.special_id(tokenizer, prompts.REPO_NAME), prompts.special_id(tokenizer, prompts.FILE_SEP)
        ids = [repo, *prompts.encode(tokenizer, "repository\n")]
        for chunk in extra:
            ids += [sep, *prompts.encode(tokenizer, f"{chunk.filename}\n{chunk.text}")]
        # the spaces before the cursor held back (the model writes them, as the language
        # server's prompt has it write them): a prompt ending in a lone space token stops
        # the model mid-word
        return ids + [sep, *prompts.encode(tokenizer, f"{case.path}\n{before[-6000:].rstrip(' ')}")]
    raise ValueError(f"unknown layout {layout!r}")


def score(case: Case, completion: str) -> tuple[bool, float]:
    """(exact match, edit similarity) of a completion against the case's truth."""
    from rapidfuzz.distance import Levenshtein

    if case.kind == "line":
        got, want = completion.split("\n", 1)[0].strip(), case.truth.strip()
    else:
        count = case.truth.count("\n") or 1
        got = "\n".join(x.rstrip() for x in completion.split("\n")[:count])
        want = "\n".join(x.rstrip() for x in case.truth.split("\n")[:count])
    return got == want, Levenshtein.normalized_similarity(got, want)


@dataclass
class Scored:
    case: Case
    layout: str
    with_context: bool
    completion: str
    exact: bool
    similarity: float
    prompt_tokens: int


def run_cases(generate: Callable[[list[int], int], str], tokenizer: Any, chosen: Sequence[Case],
              layouts: Sequence[str], on_scored: Callable[[Scored], None]) -> list[Scored]:
    """Every case in every layout, without and with context; `generate(ids, max_new)`
    returns the model's text (greedy)."""
    out = []
    for case in chosen:
        new = 32 if case.kind == "line" else 24 * BLOCK_LINES
        for layout in layouts:
            for with_context in (False, True):
                ids = prompt_ids(tokenizer, layout, case, with_context)
                text = generate(ids, new)
                exact, similarity = score(case, text)
                out.append(Scored(case, layout, with_context, text, exact, similarity, len(ids)))
                on_scored(out[-1])
    return out


def summary(scored: Sequence[Scored]) -> dict[str, Any]:
    """Per layout, with and without context, per kind: exact-match rate and mean edit similarity."""
    out: dict[str, Any] = {}
    for layout in dict.fromkeys(s.layout for s in scored):
        for with_context in (False, True):
            key = f"{layout}{' +context' if with_context else ''}"
            row: dict[str, Any] = {}
            for kind in KINDS:
                mine = [s for s in scored if s.layout == layout and s.with_context == with_context
                        and s.case.kind == kind]
                if mine:
                    row[kind] = {"exact": round(sum(s.exact for s in mine) / len(mine), 3),
                                 "similarity": round(statistics.mean(s.similarity for s in mine), 3),
                                 "cases": len(mine),
                                 "prompt_tokens": round(statistics.median(s.prompt_tokens for s in mine))}
            out[key] = row
    return out
