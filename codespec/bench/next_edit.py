"""`codespec bench next-edit`: next-edit requests built from real code, each answered
with speculation off and on (the outputs must be identical), by transformers' prompt
lookup, and scored against the edit that truly follows.

Cases come from standard-library modules no other benchmark or test uses; each is the
file after one change, that change as the recent edit, and the window the truth expects:

    rename-param   a parameter renamed in the signature: its uses in the body follow
    rename-local   a local renamed where it is first assigned: its later uses follow
    similar-lines  the first of several `self.name = name` lines made private
                   (`self._name = name`): the others follow
    add-param      a parameter added at the end of a signature: the calls within the
                   next ten lines pass it
    refactor       a local introduced for an attribute the function reads three times
                   or more (`stack = self.stack` as its first statement): the reads use it
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
from typing import Any, Callable, ContextManager, Iterator, Sequence

from codespec.bench.request_sets import functions, local_to_rename
from codespec.nextedit.history import EditHistory
from codespec.nextedit.prompt import NextEditRequest, Prompt, planned, proposed
from codespec.nextedit.rewrite import merged

# none of these is used by another request set (bench/heldout.py, apply.py, sessions.py); their
# sources are read, never imported
MODULES = ("pydoc", "wave", "pyclbr", "tabnanny", "modulefinder", "dis", "bdb", "pdb", "cProfile", "netrc", "shelve",
           "copy", "reprlib", "contextlib", "functools", "operator", "numbers", "abc", "ast", "cmd", "code", "codeop",
           "linecache", "selectors", "symtable", "uuid", "weakref", "graphlib", "secrets", "zipimport")
PER_KIND = 5
KINDS = ("rename-param", "rename-local", "similar-lines", "add-param", "refactor", "no-op")
ADDED = "strict"  # the parameter add-param adds


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
    tree = ast.parse(source)
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    for fn in functions(tree):
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
        added = _added_param(module, fn, source, lines, calls)
        if added is not None:
            yield added
        introduced = _local_introduced(module, fn, source, lines, start, body)
        if introduced is not None:
            yield introduced
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


def _offset(lines: Sequence[str], lineno: int, col: int) -> int:
    """The source offset of (1-based line, column); ast's columns are UTF-8 bytes."""
    line = lines[lineno - 1]
    return sum(len(x) for x in lines[: lineno - 1]) + len(line.encode()[:col].decode(errors="ignore"))


def _added_param(module: str, fn: ast.FunctionDef, source: str, lines: Sequence[str],
                 calls: Sequence[ast.Call]) -> Case | None:
    """`strict` added at the end of a one-line signature of positional parameters, and
    to each one-line call of the function (by name, or as `self.name`) in the ten lines
    after the `def`: the calls are the truth."""
    a = fn.args
    if a.vararg or a.kwarg or a.kwonlyargs or a.defaults or a.posonlyargs or not a.args \
            or ADDED in {x.arg for x in a.args} or fn.decorator_list:
        return None
    header = lines[fn.lineno - 1]
    close = header.rfind("):")
    if close < 0 or not header.rstrip().endswith(":") or "(" not in header:
        return None
    method = a.args[0].arg in ("self", "cls")
    sites = []
    for call in calls:
        callee = call.func
        named = isinstance(callee, ast.Name) and callee.id == fn.name and not method
        bound = isinstance(callee, ast.Attribute) and callee.attr == fn.name and method \
            and isinstance(callee.value, ast.Name) and callee.value.id in ("self", "cls")
        if not (named or bound) or not fn.lineno < call.lineno <= fn.lineno + 10 \
                or call.lineno != call.end_lineno or call.keywords \
                or any(isinstance(x, ast.Starred) for x in call.args):
            continue
        sites.append(_offset(lines, call.end_lineno, call.end_col_offset) - 1)  # its closing parenthesis
    if not sites:
        return None
    at = sum(len(x) for x in lines[: fn.lineno - 1]) + close
    after = source[:at] + f", {ADDED}" + source[at:]
    shift = len(f", {ADDED}")
    truth = after
    for site in sorted(sites, reverse=True):
        site += shift
        opened = truth[:site].rstrip().endswith("(")  # no arguments yet: no comma before it
        truth = truth[:site] + (ADDED if opened else f", {ADDED}") + truth[site:]
    return Case(f"{module}.{fn.name}", "add-param", source, after, at + shift, truth)


def _local_introduced(module: str, fn: ast.FunctionDef, source: str, lines: Sequence[str], start: int,
                      body: str) -> Case | None:
    """`name = self.name` put first in the body, for an attribute of `self` the function
    only reads, three times or more, and whose name it does not use: every later read
    becomes `name` (the truth)."""
    reads: dict[str, int] = {}
    stored, names = set(), {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)}
    for node in ast.walk(fn):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            if isinstance(node.ctx, ast.Load):
                reads[node.attr] = reads.get(node.attr, 0) + 1
            else:
                stored.add(node.attr)
    attr = next((n for n, count in reads.items() if count >= 3 and n not in stored and n not in names
                 and not n.startswith("_") and _keyword_safe(n)), None)
    first = fn.body[0]
    if attr is None or isinstance(first, ast.Expr) and isinstance(getattr(first, "value", None), ast.Constant):
        return None  # a docstring first: the line would go after it; such functions are left out
    if first.lineno == fn.lineno:
        return None  # a one-line body
    line_start = sum(len(x) for x in lines[: first.lineno - 1])
    indent = lines[first.lineno - 1][: first.col_offset]
    inserted = f"{indent}{attr} = self.{attr}\n"
    after = source[:line_start] + inserted + source[line_start:]
    rest = after[line_start + len(inserted): start + len(body) + len(inserted)]
    truth = after[: line_start + len(inserted)] + re.sub(rf"\bself\.{attr}\b", attr, rest) \
        + after[start + len(body) + len(inserted):]
    return Case(f"{module}.{fn.name}", "refactor", source, after, line_start + len(inserted) - 1, truth)


def _keyword_safe(name: str) -> bool:
    """A name a local may take: no keyword, no builtin it would hide."""
    import builtins
    import keyword

    return not keyword.iskeyword(name) and not hasattr(builtins, name)


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


# a peer: (prompt ids, tokens to generate, the previous request's prompt ids) -> (its tokens,
# seconds); opened (a server started) when its turn comes, closed after it
Peer = Callable[[list[int], int, list[int]], tuple[list[int], float]]
OpenPeer = Callable[[], ContextManager[Peer]]


def run_cases(engine: Any, tokenizer: Any, chosen: Sequence[Case], layout: str, peers: dict[str, OpenPeer],
              on_answer: Callable[[Answer], None]) -> list[Answer]:
    """Every case under plain decoding and codespec, one after the other per case; then
    every case through each peer (transformers' prompt lookup, llama.cpp's lookups), one
    peer at a time, so that no other system's threads run beside the one timed.

    Warm as in an editor: before each system's request the server answered the request
    made before the change (the file as it was, no recent edits), so its prompt cache holds
    what that prompt shares with this one, and nothing of this one (codespec's KV cache is
    cleared between systems; llama-server gets the same earlier prompt; transformers keeps
    no cache between calls). A peer generates as many tokens as plain decoding's answer
    has: the early stop (the rewrite re-joined the window) is codespec's own, and the same
    work is timed for all."""
    from codespec.engine.run import GenerationConfig

    answers: list[Answer] = []
    asked: list[tuple[Case, Prompt, list[int], int]] = []  # (case, prompt, earlier prompt's ids, plain's tokens)

    def answered(case: Case, prompt: Prompt, system: str, tokens: list[int], seconds: float, passes: int,
                 text: str) -> None:
        edits = proposed(prompt, text)
        first, last, span = merged(case.after, edits)
        result = case.after[:first] + span + case.after[last:]
        answers.append(Answer(case, system, seconds, tokens, passes, result == case.truth, not edits))
        on_answer(answers[-1])

    for case in chosen:
        path = f"{case.name.split('.')[0]}.py"
        history = EditHistory()
        history.update(case.name, case.before)
        # the request before the change: the cursor on the same line (its offset in the
        # text after the change may fall on another line of the text before it)
        line = case.after.count("\n", 0, case.cursor)
        at = sum(len(x) for x in case.before.splitlines(keepends=True)[:line])
        earlier, _ = planned(layout, tokenizer, NextEditRequest(path, case.before, at, []))
        history.update(case.name, case.after)
        prompt, fields = planned(layout, tokenizer, NextEditRequest(path, case.after, case.cursor, history.recent()))
        for system, speculate in (("plain", False), ("codespec", True)):
            engine.cache.clear()
            engine.generate(earlier.ids, GenerationConfig(max_new_tokens=1, speculate=False))
            began = time.perf_counter()
            g = engine.generate(prompt.ids, GenerationConfig(**fields, speculate=speculate))
            answered(case, prompt, system, g.token_ids, time.perf_counter() - began, g.stats.verify_passes, g.text)
            if system == "plain":
                asked.append((case, prompt, earlier.ids, len(g.token_ids)))
    for system, open_peer in peers.items():
        with open_peer() as peer:
            for case, prompt, earlier_ids, plain_tokens in asked:
                tokens, seconds = peer(prompt.ids, max(1, plain_tokens), earlier_ids)
                answered(case, prompt, system, tokens, seconds, 0, engine.decode(tokens))
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
