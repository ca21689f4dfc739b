"""Sets of different requests for the batched verifier benchmark (`codespec bench verify`),
built from stdlib source that every machine has.

* `edit_set`: agent-style edits: rename a local variable inside a function, answer the
  whole function (chat template). Functions from several stdlib modules.
* `repo_fim_set`: repository completion: functions from files of the stdlib `email`
  package, each cut after its docstring and FIM-completed with ~1k tokens of its file
  before the cursor and ~256 after; the repository index holds the package's other
  files (never the target files).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from codespec.bench.windows import FIM_PREFIX_TOKENS, FIM_SUFFIX_TOKENS, keep_head, keep_tail
from codespec.prompts import fim_ids

EDIT_MODULES = ("textwrap", "shlex", "json.decoder", "json.encoder", "csv", "difflib", "calendar", "string",
                "configparser", "fractions")
REPO_PACKAGE = "email"
FIM_FILES = ("_encoded_words.py", "_parseaddr.py", "base64mime.py", "charset.py", "header.py", "message.py",
             "quoprimime.py", "utils.py", "feedparser.py", "generator.py")
MIN_LINES, MAX_LINES = 10, 40


@dataclass(frozen=True)
class Workload:
    """One request of a set."""

    name: str
    description: str
    prompt_ids: tuple[int, ...]
    max_new_tokens: int


def functions(tree: ast.AST) -> list[ast.FunctionDef]:
    found = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
    return sorted(found, key=lambda n: n.lineno)


def local_to_rename(fn: ast.FunctionDef) -> str | None:
    """A local variable assigned in the body and used at least three times."""
    params = {a.arg for a in fn.args.args + fn.args.kwonlyargs}
    counts: dict[str, int] = {}
    stored: list[str] = []
    for node in ast.walk(fn):
        if isinstance(node, ast.Name):
            counts[node.id] = counts.get(node.id, 0) + 1
            if isinstance(node.ctx, ast.Store) and node.id not in params and node.id not in stored:
                stored.append(node.id)
    return next((name for name in stored if counts[name] >= 3 and len(name) > 2), None)


def edit_set(tokenizer: Any, count: int = 8, max_new_tokens: int = 96) -> list[Workload]:
    out: list[Workload] = []
    for module_name in EDIT_MODULES:
        module = importlib.import_module(module_name)
        source = inspect.getsource(module)
        for fn in functions(ast.parse(source)):
            lines = fn.end_lineno - fn.lineno + 1 if fn.end_lineno else 0
            name = local_to_rename(fn)
            if not MIN_LINES <= lines <= MAX_LINES or name is None:
                continue
            body = textwrap.dedent("".join(source.splitlines(keepends=True)[fn.lineno - 1 : fn.end_lineno]))
            instruction = (f"Rename the local variable `{name}` to `{name}_value` in this function. "
                           f"Reply with the complete function only.\n\n```python\n{body}```")
            text = tokenizer.apply_chat_template([{"role": "user", "content": instruction}],
                                                 add_generation_prompt=True, tokenize=False)
            ids = tuple(tokenizer(text, add_special_tokens=False)["input_ids"])
            out.append(Workload(f"edit:{module_name}.{fn.name}", f"rename {name} in {module_name}.{fn.name}",
                                ids, max_new_tokens))
            break  # one function per module: varied requests
        if len(out) == count:
            break
    return out


def package_dir() -> Path:
    return Path(importlib.import_module(REPO_PACKAGE).__file__ or "").parent


def repo_fim_set(tokenizer: Any, count: int = 8, max_new_tokens: int = 96) -> tuple[list[Workload], dict[str, str]]:
    """(requests, repository files to index: path -> text, target files excluded)."""
    root = package_dir()
    targets = [root / name for name in FIM_FILES][:count]
    out: list[Workload] = []
    for path in targets:
        source = path.read_text(encoding="utf-8")
        for fn in functions(ast.parse(source)):
            lines = (fn.end_lineno or 0) - fn.lineno + 1
            doc = ast.get_docstring(fn)
            if not MIN_LINES <= lines <= 60 or doc is None or len(fn.body) < 3:
                continue
            cut_line = fn.body[1].lineno - 1  # the first statement after the docstring
            lines_list = source.splitlines(keepends=True)
            prefix = keep_tail(tokenizer, "".join(lines_list[:cut_line]), FIM_PREFIX_TOKENS)
            suffix = keep_head(tokenizer, "".join(lines_list[(fn.end_lineno or cut_line):]), FIM_SUFFIX_TOKENS)
            out.append(Workload(f"fim:{path.stem}.{fn.name}", f"complete {REPO_PACKAGE}/{path.name} {fn.name}",
                                tuple(fim_ids(tokenizer, prefix, suffix)), max_new_tokens))
            break
    excluded = {p.resolve() for p in targets}
    files = {str(p.relative_to(root.parent)): p.read_text(encoding="utf-8")
             for p in sorted(root.rglob("*.py")) if p.resolve() not in excluded}
    return out, files
