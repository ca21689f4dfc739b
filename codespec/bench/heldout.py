"""Held-out requests for the lossless stress test: FIM and edit prompts cut from standard
library code that no benchmark, test or example of the project otherwise uses.

* FIM: functions of files in several stdlib packages, cut at varied points (after the
  docstring, after the signature, in the middle of the body), with an editor-like window
  (~1k tokens before the cursor, ~256 after). Each carries the package's other files
  as its repository (the target file is never in it), so speculation drafts from an
  index as `codespec generate --index FILE` does.
* edit: "rename this local, reply with the complete function" through the chat
  template, one function from each of many modules.

Every prompt is built deterministically from the installed Python's own sources, so
every machine has them offline; the set changes only with the Python version.

    requests = heldout_requests(tokenizer)          # 36 FIM + 20 edit
    [r.name for r in requests][:2]                   # ['fim:logging/handlers.py:...', ...]
"""

from __future__ import annotations

import ast
import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from codespec.bench.request_sets import functions
from codespec.bench.sessions import edit_targets, rename_instruction
from codespec.bench.windows import FIM_PREFIX_TOKENS, FIM_SUFFIX_TOKENS, keep_head, keep_tail
from codespec.prompts import chat_ids, fim_ids

# package -> (target files, functions cut per file); none of these is used by the
# benchmarks (email, textwrap, shlex, json, csv, difflib, ...) or the other tests
FIM_TARGETS: dict[str, tuple[tuple[str, ...], int]] = {
    "logging": (("handlers.py", "config.py"), 3),
    "http": (("client.py", "cookiejar.py", "server.py"), 2),
    "urllib": (("request.py", "parse.py", "robotparser.py"), 2),
    "xml.etree": (("ElementTree.py", "ElementPath.py"), 3),
    "unittest": (("case.py", "loader.py", "mock.py"), 2),
    "asyncio": (("base_events.py", "streams.py", "tasks.py"), 2),
}
EDIT_MODULES = ("argparse", "pprint", "heapq", "statistics", "tarfile", "pathlib", "inspect", "ftplib",
                "gettext", "optparse", "sched", "smtplib", "tokenize", "traceback", "zipfile", "glob",
                "mimetypes", "plistlib", "pstats", "ipaddress", "imaplib", "mailbox", "tempfile", "random")
EDIT_COUNT = 20
CUTS = ("docstring", "signature", "middle")  # where a FIM request's cursor sits, in turn
FIM_LINES = (6, 80)  # function lengths that make a fair completion
EDIT_LINES = (8, 30)  # functions an edit answers whole


@dataclass(frozen=True)
class HeldoutRequest:
    name: str
    kind: str  # "fim" or "edit"
    prompt_ids: tuple[int, ...]
    repository: dict[str, str] = field(default_factory=dict, repr=False)  # path -> text, target excluded


def heldout_requests(tokenizer: Any) -> list[HeldoutRequest]:
    """Every held-out request, FIM first, in a fixed order."""
    return [*fim_requests(tokenizer), *edit_requests(tokenizer)]


def fim_requests(tokenizer: Any) -> list[HeldoutRequest]:
    out: list[HeldoutRequest] = []
    turn = 0
    for package, (targets, per_file) in FIM_TARGETS.items():
        root = Path(importlib.import_module(package).__file__ or "").parent
        files = {p: p.read_text(encoding="utf-8") for p in sorted(root.rglob("*.py"))}
        for target in targets:
            path = root / target
            source = files[path]
            repository = {str(p.relative_to(root.parent)): text for p, text in files.items() if p != path}
            for fn in _spread(_fim_functions(source), per_file):
                cut = CUTS[turn % len(CUTS)]
                turn += 1
                prefix, suffix = _split(source, fn, cut)
                ids = fim_ids(tokenizer, keep_tail(tokenizer, prefix, FIM_PREFIX_TOKENS),
                              keep_head(tokenizer, suffix, FIM_SUFFIX_TOKENS))
                out.append(HeldoutRequest(f"fim:{package}/{target}:{fn.name}@{cut}", "fim", tuple(ids), repository))
    return out


def edit_requests(tokenizer: Any, count: int = EDIT_COUNT) -> list[HeldoutRequest]:
    out: list[HeldoutRequest] = []
    for module_name, fn, body, local in edit_targets(EDIT_MODULES, count, EDIT_LINES):
        ids = chat_ids(tokenizer, [{"role": "user", "content": rename_instruction(local, f"{local}_value", body)}])
        out.append(HeldoutRequest(f"edit:{module_name}.{fn.name}", "edit", tuple(ids)))
    return out


def _fim_functions(source: str) -> list[ast.FunctionDef]:
    return [fn for fn in functions(ast.parse(source))
            if FIM_LINES[0] <= (fn.end_lineno or 0) - fn.lineno + 1 <= FIM_LINES[1] and len(fn.body) >= 2]


def _spread(items: list[ast.FunctionDef], count: int) -> list[ast.FunctionDef]:
    """`count` items evenly spread over the list (functions from the whole file)."""
    if len(items) <= count:
        return items
    step = len(items) / count
    return [items[int(i * step + step / 2)] for i in range(count)]


def _split(source: str, fn: ast.FunctionDef, cut: str) -> tuple[str, str]:
    """(text before the cursor, text after the completed part) for a cut in `fn`."""
    lines = source.splitlines(keepends=True)
    body = fn.body[1:] if ast.get_docstring(fn) is not None and cut == "docstring" else fn.body
    if cut == "middle":
        first = body[len(body) // 2].lineno - 1
    else:  # after the docstring (when there is one) or right after the signature
        first = body[0].lineno - 1
    end = fn.end_lineno or first
    return "".join(lines[:first]), "".join(lines[end:])
