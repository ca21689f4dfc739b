"""The benchmark suite's workloads: sequences of requests built from real code.

Everything comes from the Python standard library, so every machine has it offline:

* `repo`: repository completion. Files of the stdlib `email` package are targets; each
  chosen function is cut after its signature and its body (docstring included) is
  FIM-completed with ~1k tokens of its file before the cursor and ~256 after. The
  repository index holds the package's other files, never a target.
* `edit`: agentic edits. "Rename this local variable, reply with the whole function",
  through the chat template, one function from each of several modules.
* `agent`: an agent loop over two functions: the edit, then the conversation resent
  with the model's answer and a second instruction, then the first request resent with
  a small change (another new name). Past generations and cached prompt prefixes are
  what a serving system can reuse here.
* `editor`: one editing session in one file: the user types a function's body line by
  line and a completion is requested after each line (FIM, the prefix window anchored
  where the session started, as editor plugins do), with a short token budget.

A request's prompt may depend on earlier answers (the agent loop resends the model's
own answer), so a workload is a list of steps that build their prompt from the outputs
so far; each system feeds them its own outputs.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from codespec.bench.request_sets import FIM_FILES, MIN_LINES, functions, local_to_rename, package_dir
from codespec.bench.windows import FIM_PREFIX_TOKENS, FIM_SUFFIX_TOKENS, keep_head, keep_tail
from codespec.prompts import chat_ids, fim_ids

AGENT_MODULES = ("textwrap", "shlex")
EDIT_MODULES = ("textwrap", "shlex", "json.decoder", "csv", "difflib", "calendar", "string", "fractions")
EDITOR_FILE, EDITOR_FUNCTION = "utils.py", "formataddr"
EDIT_MAX_LINES = 24  # whole-function answers stay a few hundred tokens


@dataclass(frozen=True)
class Step:
    name: str
    prompt: Callable[[Sequence[str]], tuple[int, ...]]  # earlier answers (text) -> prompt ids
    max_new_tokens: int


@dataclass
class Workload:
    name: str
    description: str
    steps: list[Step]
    files: dict[str, str] = field(default_factory=dict)  # repository files for the index: path -> text


def _fixed(ids: Sequence[int]) -> Callable[[Sequence[str]], tuple[int, ...]]:
    frozen = tuple(ids)
    return lambda answers: frozen


def edit_targets(modules: Sequence[str], count: int, lines: tuple[int, int] = (MIN_LINES, EDIT_MAX_LINES)
                 ) -> list[tuple[str, ast.FunctionDef, str, str]]:
    """(module, function node, function source, a local to rename) for `count` modules:
    each module's first function of `lines` (min, max) lines with a local to rename."""
    found = []
    for module_name in modules:
        source = inspect.getsource(importlib.import_module(module_name))
        for fn in functions(ast.parse(source)):
            length = (fn.end_lineno or 0) - fn.lineno + 1
            local = local_to_rename(fn)
            if lines[0] <= length <= lines[1] and local is not None:
                body = textwrap.dedent("".join(source.splitlines(keepends=True)[fn.lineno - 1 : fn.end_lineno]))
                found.append((module_name, fn, body, local))
                break
        if len(found) == count:
            break
    return found


def rename_instruction(name: str, new: str, body: str) -> str:
    return (f"Rename the local variable `{name}` to `{new}` in this function. "
            f"Reply with the complete function only.\n\n```python\n{body}```")


def edit_workload(tokenizer: Any, count: int = 4, max_new_tokens: int = 320) -> Workload:
    steps = []
    for module_name, fn, body, local in edit_targets(EDIT_MODULES, count):
        ids = chat_ids(tokenizer, [{"role": "user", "content": rename_instruction(local, f"{local}_value", body)}])
        steps.append(Step(f"{module_name}.{fn.name}", _fixed(ids), max_new_tokens))
    return Workload("edit", "rename a local, answer the whole function (chat), functions of "
                    f"{len(steps)} stdlib modules", steps)


def agent_workload(tokenizer: Any, count: int = 2, max_new_tokens: int = 320) -> Workload:
    steps: list[Step] = []
    for module_name, fn, body, local in edit_targets(AGENT_MODULES, count):
        first = rename_instruction(local, f"{local}_value", body)
        other = _second_local(fn, local)
        follow_up = (f"Also rename `{other}` to `{other}_value`. Reply with the complete function only."
                     if other else "Now add type hints to the parameters. Reply with the complete function only.")
        at = len(steps)  # the answer to this function's first request

        def resent(answers: Sequence[str], first: str = first, follow_up: str = follow_up, at: int = at) -> tuple[int, ...]:
            return tuple(chat_ids(tokenizer, [{"role": "user", "content": first},
                                              {"role": "assistant", "content": answers[at]},
                                              {"role": "user", "content": follow_up}]))

        retry = rename_instruction(local, f"{local}_new", body)  # the same request with a small change
        steps += [Step(f"{fn.name}:edit", _fixed(chat_ids(tokenizer, [{"role": "user", "content": first}])),
                       max_new_tokens),
                  Step(f"{fn.name}:follow-up", resent, max_new_tokens),
                  Step(f"{fn.name}:retry", _fixed(chat_ids(tokenizer, [{"role": "user", "content": retry}])),
                       max_new_tokens)]
    return Workload("agent", f"agent loop over {count} functions: edit, follow-up with the answer resent, "
                    "retry with a small change (chat)", steps)


def _second_local(fn: ast.FunctionDef, first: str) -> str | None:
    params = {a.arg for a in fn.args.args + fn.args.kwonlyargs}
    names = [n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)]
    return next((n for n in names if n != first and n not in params and len(n) > 2), None)


def repo_workload(tokenizer: Any, count: int = 4, max_new_tokens: int = 128) -> Workload:
    root = package_dir()
    targets: list[Path] = []
    steps = []
    for name in FIM_FILES:
        path = root / name
        source = path.read_text(encoding="utf-8")
        lines = source.splitlines(keepends=True)
        for fn in functions(ast.parse(source)):
            length = (fn.end_lineno or 0) - fn.lineno + 1
            if not MIN_LINES <= length <= 60 or len(fn.body) < 2:
                continue
            cut = fn.body[0].lineno - 1  # the signature ends on the line before the body (or docstring)
            prefix = keep_tail(tokenizer, "".join(lines[:cut]), FIM_PREFIX_TOKENS)
            suffix = keep_head(tokenizer, "".join(lines[fn.end_lineno or cut :]), FIM_SUFFIX_TOKENS)
            steps.append(Step(f"{path.stem}.{fn.name}", _fixed(fim_ids(tokenizer, prefix, suffix)), max_new_tokens))
            targets.append(path)
            break
        if len(steps) == count:
            break
    return Workload("repo", f"FIM-complete a function body after its signature in {len(steps)} files of the "
                    "stdlib email package; the index holds the package without them", steps,
                    _package_files(root, targets))


def editor_workload(tokenizer: Any, requests: int = 8, max_new_tokens: int = 48) -> Workload:
    root = package_dir()
    path = root / EDITOR_FILE
    source = path.read_text(encoding="utf-8")
    fn = next(f for f in functions(ast.parse(source)) if f.name == EDITOR_FUNCTION)
    lines = source.splitlines(keepends=True)
    first_body = fn.body[0].lineno - 1
    body_lines = list(range(first_body, fn.end_lineno or first_body))
    # cursors: at the start of evenly spaced body lines, everything above already typed
    picks = [body_lines[i * len(body_lines) // requests] for i in range(requests)]
    # the prefix window is anchored where the session starts (editor plugins keep it
    # stable so the server's prompt cache stays valid as the cursor moves down)
    window = keep_tail(tokenizer, "".join(lines[:first_body]), FIM_PREFIX_TOKENS)
    anchor = len("".join(lines[:first_body])) - len(window)
    suffix = keep_head(tokenizer, "".join(lines[fn.end_lineno or first_body :]), FIM_SUFFIX_TOKENS)
    steps = []
    for i, line in enumerate(picks):
        prefix = "".join(lines[:line])[anchor:]
        steps.append(Step(f"{fn.name}:{i + 1}", _fixed(fim_ids(tokenizer, prefix, suffix)), max_new_tokens))
    return Workload("editor", f"{requests} completions while typing {EDITOR_FUNCTION} in email/{EDITOR_FILE} "
                    "(FIM; the index holds the package without this file)", steps, _package_files(root, [path]))


def _package_files(root: Path, excluded: Sequence[Path]) -> dict[str, str]:
    skip = {p.resolve() for p in excluded}
    return {str(p.relative_to(root.parent)): p.read_text(encoding="utf-8")
            for p in sorted(root.rglob("*.py")) if p.resolve() not in skip}


WORKLOADS: dict[str, Callable[[Any], Workload]] = {
    "repo": repo_workload,
    "edit": edit_workload,
    "agent": agent_workload,
    "editor": editor_workload,
}

__all__ = ["Step", "Workload", "WORKLOADS"]
