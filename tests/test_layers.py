"""The folders show the architecture, and imports only point down it.

Layers, lowest first (README "Layout"): a module may import its own layer or any below,
at module level or inside a function, never one above. Within a layer, packages must not
import each other in a circle."""

from __future__ import annotations

import ast
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAYERS = [
    # the cuda backend's settings model, which Settings holds, is pydantic alone
    {"codespec.errors", "codespec.settings", "codespec.prompts", "codespec.tempfiles",
     "codespec.forward.cuda.settings"},
    {"codespec.kernels", "codespec.index", "codespec.models", "codespec.landing", "codespec.structured",
     "codespec.nextedit"},
    {"codespec.forward"},
    {"codespec.verify"},
    {"codespec.policy"},
    {"codespec.engine"},
    {"codespec.cli", "codespec.server", "codespec.bench", "codespec.integrations", "codespec.indexing",
     "codespec.lsp", "codespec.__main__"},
]
ROOT_MODULES = {"__init__.py", "__main__.py", "errors.py", "settings.py", "prompts.py", "tempfiles.py"}


def unit(module: str) -> str | None:
    """The layered unit a dotted module name belongs to (its package under codespec)."""
    for layer in LAYERS:
        for name in layer:
            if module == name or module.startswith(name + "."):
                return name
    return None


def rank(name: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if name in layer)


def sources() -> dict[str, Path]:
    """Every module of the distribution by dotted name (the linked top-level folders too)."""
    found = {}
    for folder, _, files in os.walk(ROOT / "codespec", followlinks=True):  # codespec/index -> ../index, ...
        for name in files:
            if name.endswith(".py"):
                parts = (Path(folder) / name).relative_to(ROOT).with_suffix("").parts
                found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = Path(folder) / name
    return found


def imports(path: Path, module: str) -> set[str]:
    """The codespec modules `path` imports anywhere in its code (not in docstrings)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against the importing package
                package = module.split(".")[: len(module.split(".")) - node.level + (path.name == "__init__.py")]
                base = ".".join([*package, base] if base else package)
            out.add(base)
            out.update(f"{base}.{alias.name}" for alias in node.names)
    return {name for name in out if name.startswith("codespec")}


def test_every_module_is_in_a_layer():
    assert {unit(module) for module in sources()} - {None} == set().union(*LAYERS)
    assert [m for m in sources() if unit(m) is None] == ["codespec"]


def test_the_root_holds_a_handful_of_modules():
    assert {p.name for p in (ROOT / "codespec").glob("*.py")} <= ROOT_MODULES


def test_no_module_imports_a_layer_above_its_own():
    upward = []
    for module, path in sources().items():
        own = unit(module)
        if own is None:
            continue
        for target in imports(path, module):
            other = unit(target)
            if other is not None and rank(other) > rank(own):
                upward.append(f"{module} imports {target}")
    assert not upward, "\n".join(upward)


def test_packages_import_each_other_in_no_circle():
    edges: dict[str, set[str]] = {}
    for module, path in sources().items():
        own = unit(module)
        if own is None:
            continue
        edges.setdefault(own, set()).update(u for t in imports(path, module) if (u := unit(t)) not in (None, own))
    seen: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(name: str, path: list[str]) -> None:
        seen[name] = 1
        for other in sorted(edges.get(name, ())):
            assert seen.get(other) != 1, "import circle: " + " -> ".join([*path, name, other])
            if other not in seen:
                visit(other, [*path, name])
        seen[name] = 2

    for name in sorted(edges):
        if name not in seen:
            visit(name, [])
