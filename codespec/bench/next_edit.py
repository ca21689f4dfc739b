"""`codespec bench next-edit`: next-edit requests built from real code, each answered
with speculation off and on (the outputs must be identical), by transformers' prompt
lookup, and scored against the edit that truly follows.

Cases come from standard-library modules no other benchmark or test uses; each is the
file after one change, that change as the recent edit, and the window the truth expects:

    rename-param   a parameter renamed in the signature: its uses in the body follow
    rename-local   a local renamed where it is first assigned: its later uses follow
    similar-lines  the first of several `self.name = name` lines made private
                   (`self._name = name`): the others follow
    no-op          a word added to a comment: nothing follows

Reported per layout: latency (the first request, median, 95th percentile; warm, one
process), tokens per verify pass, the exact-edit rate per kind (the rewrite's edits turn
the document into the truth), the no-op rate (no edit proposed where none follows),
and the same requests' time with plain decoding and transformers' prompt lookup.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from codespec.bench.request_sets import functions, local_to_rename
from codespec.nextedit.history import EditHistory
from codespec.nextedit.prompt import NextEditRequest, planned, proposed
from codespec.nextedit.rewrite import merged

# none of these is used by another request set (bench/heldout.py, apply.py, sessions.py); their
# sources are read, never imported
MODULES = ("pydoc", "wave", "pyclbr", "tabnanny", "modulefinder", "dis", "bdb", "pdb", "cProfile", "netrc", "shelve",
           "copy", "reprlib", "contextlib", "functools", "operator", "numbers", "abc", "ast", "cmd", "code", "codeop",
           "linecache", "selectors", "symtable", "uuid", "weakref", "graphlib", "secrets", "zipimport")
PER_KIND = 5
KINDS = ("rename-param", "rename-local", "similar-lines", "no-op")


@dataclass(frozen=True)
class Case:
    name: str
    kind: str
    before: str  # the file before the user's change
    after: str  # ... and after it (what the request holds)
    cursor: int  # where the change left the cursor
    truth: str  # the file once the next edit is made (== after for a no-op)


def cases(per_kind: int = PER_KIND) -> list[Case]:
    """Up to `per_kind` cases of each kind, in a fixed order."""
    found: dict[str, list[Case]] = {kind: [] for kind in KINDS}
    for module in MODULES:
        spec = importlib.util.find_spec(module)
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            continue  # not in this Python, or not Python source
        source = Path(spec.origin).read_text(encoding="utf-8")
        taken: set[str] = set()  # one case of a kind per module: the set spreads over the modules
        for case in _cases_in(module, source):
            if case.kind not in taken and len(found[case.kind]) < per_kind:
                found[case.kind].append(case)
                taken.add(case.kind)
        if all(len(v) >= per_kind for v in found.values()):
            break
    return [case for kind in KINDS for case in found[kind]]


def _cases_in(module: str, source: str) -> Iterator[Case]:
    lines = source.splitlines(keepends=True)
    for fn in functions(ast.parse(source)):
        length = (fn.end_lineno or fn.lineno) - fn.lineno + 1
        if not 4 <= length <= 18:
            continue
        body = "".join(lines[fn.lineno - 1: fn.end_lineno])
        start = sum(len(x) for x in lines[: fn.lineno - 1])
        params = [a.arg for a in fn.args.args if a.arg not in ("self", "cls")]
        used = [p for p in params if len(re.findall(rf"\b{p}\b", body)) >= 3]
        if used:
            yield _renamed(module, fn.name, "rename-param", source, start, body, used[0], first_line=True)
        local = local_to_rename(fn)
        if local is not None:
            yield _renamed(module, fn.name, "rename-local", source, start, body, local, first_line=False)
        run = _assignments(body)
        if run:
            yield _privatised(module, fn.name, source, start, body, run)
        comment = re.search(r"^(\s*# )(\w+)", body, re.M)
        if comment:
            changed = body[: comment.end(1)] + "Note: " + body[comment.end(1):]
            after = source[:start] + changed + source[start + len(body):]
            yield Case(f"{module}.{fn.name}", "no-op", source, after, start + comment.end(1) + len("Note: "), after)


def _renamed(module: str, fn: str, kind: str, source: str, start: int, body: str, name: str,
             first_line: bool) -> Case:
    """`name` renamed at its first occurrence (in the signature, or at its first
    assignment): the user's change; every occurrence renamed: the truth."""
    new = f"{name}_value"
    pattern = rf"\b{name}\b"
    occurrences = [m.start() for m in re.finditer(pattern, body)]
    first = occurrences[0] if first_line else next(
        (o for o in occurrences if re.match(rf"{name}\s*=[^=]", body[o:])), occurrences[0])
    changed = body[:first] + new + body[first + len(name):]
    after = source[:start] + changed + source[start + len(body):]
    truth = source[:start] + re.sub(pattern, new, body) + source[start + len(body):]
    return Case(f"{module}.{fn}", kind, source, after, start + first + len(new), truth)


def _assignments(body: str) -> list[re.Match[str]]:
    """Three or more `self.x = x` lines in a row."""
    run: list[re.Match[str]] = []
    for match in re.finditer(r"^(\s*)self\.(\w+) = (\w+)\n", body, re.M):
        if run and match.start() != run[-1].end():
            if len(run) >= 3:
                return run
            run = []
        if match.group(2) == match.group(3):
            run.append(match)
    return run if len(run) >= 3 else []


def _privatised(module: str, fn: str, source: str, start: int, body: str, run: list[re.Match[str]]) -> Case:
    def private(text: str, matches: Sequence[re.Match[str]]) -> str:
        for m in reversed(matches):
            text = text[: m.start(2)] + "_" + text[m.start(2):]
        return text

    changed, truth = private(body, run[:1]), private(body, run)
    return Case(f"{module}.{fn}", "similar-lines", source, source[:start] + changed + source[start + len(body):],
                start + run[0].end() - 1, source[:start] + truth + source[start + len(body):])


@dataclass
class Answer:
    case: Case
    system: str
    latency_s: float
    tokens: list[int]
    passes: int
    exact: bool
    no_edit: bool


def run_cases(engine: Any, tokenizer: Any, chosen: Sequence[Case], layout: str,
              hf: Callable[[list[int], int], tuple[list[int], float]] | None,
              on_answer: Callable[[Answer], None]) -> list[Answer]:
    """Every case under plain decoding, codespec and (given `hf`) transformers' prompt
    lookup, one after another per case; codespec's engine keeps its caches between
    cases, as a running server does."""
    from codespec.engine.run import GenerationConfig

    answers = []
    for case in chosen:
        history = EditHistory()
        history.update(case.name, case.before)
        history.update(case.name, case.after)
        prompt, fields = planned(layout, tokenizer, NextEditRequest(f"{case.name.split('.')[0]}.py", case.after,
                                                                    case.cursor, history.recent()))
        runs: list[tuple[str, list[int], float, int, str]] = []
        for system, speculate in (("plain", False), ("codespec", True)):
            began = time.perf_counter()
            g = engine.generate(prompt.ids, GenerationConfig(**fields, speculate=speculate))
            runs.append((system, g.token_ids, time.perf_counter() - began, g.stats.verify_passes, g.text))
        if hf is not None:
            tokens, seconds = hf(prompt.ids, fields["max_new_tokens"])
            runs.append(("hf_prompt_lookup", tokens, seconds, 0, engine.decode(tokens)))
        for system, tokens, seconds, passes, text in runs:
            edits = proposed(prompt, text)
            first, last, span = merged(case.after, edits)
            result = case.after[:first] + span + case.after[last:]
            answer = Answer(case, system, seconds, tokens, passes, result == case.truth, not edits)
            answers.append(answer)
            on_answer(answer)
    return answers


def summary(answers: Sequence[Answer]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for system in dict.fromkeys(a.system for a in answers):
        mine = [a for a in answers if a.system == system]
        latencies = sorted(a.latency_s for a in mine)
        row: dict[str, Any] = {
            "first_s": round(mine[0].latency_s, 3),
            "p50_s": round(statistics.median(latencies), 3),
            "p95_s": round(latencies[min(len(latencies) - 1, round(0.95 * (len(latencies) - 1)))], 3),
            "total_s": round(sum(latencies), 3),
            "exact_by_kind": {kind: f"{sum(a.exact for a in mine if a.case.kind == kind)}/"
                                    f"{sum(1 for a in mine if a.case.kind == kind)}" for kind in KINDS},
        }
        if any(a.passes for a in mine):
            row["tokens_per_pass"] = round(sum(len(a.tokens) for a in mine) / max(1, sum(a.passes for a in mine)), 2)
        out[system] = row
    plain = {a.case.name + a.case.kind: a.tokens for a in answers if a.system == "plain"}
    out["identical"] = all(plain[a.case.name + a.case.kind] == a.tokens for a in answers if a.system == "codespec")
    if "plain" in out and "codespec" in out:
        out["codespec_vs_plain"] = round(out["plain"]["total_s"] / out["codespec"]["total_s"], 2)
    return out
