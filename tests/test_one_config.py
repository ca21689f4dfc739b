"""One source of configuration: no module but codespec/settings.py reads or writes the
process environment (settings travel as `Settings` values, or as CODESPEC_* variables of
a child process built by settings.child_environment)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ALLOWED = {ROOT / "codespec" / "settings.py"}


def environment_uses(source: str) -> list[int]:
    """Lines that touch os.environ, os.getenv/putenv/unsetenv, or `environ` imported from os."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "os" \
                and node.attr in ("environ", "environb", "getenv", "putenv", "unsetenv"):
            lines.append(node.lineno)
        if isinstance(node, ast.ImportFrom) and node.module == "os" and \
                any(alias.name in ("environ", "getenv", "putenv") for alias in node.names):
            lines.append(node.lineno)
    return lines


def test_the_finder_finds_each_kind_of_use():
    source = "import os\nfrom os import environ\nos.environ['A'] = '1'\nx = os.getenv('B')\nos.path.join('a')\n"
    assert sorted(environment_uses(source)) == [2, 3, 4]


def test_no_module_but_the_settings_reads_the_environment():
    found = {}
    for folder in ("codespec", "lsp", "index"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.resolve() in ALLOWED or "__pycache__" in path.parts:
                continue
            lines = environment_uses(path.read_text(encoding="utf-8"))
            if lines:
                found[str(path.relative_to(ROOT))] = lines
    assert not found, f"read the environment through codespec.settings instead: {found}"
