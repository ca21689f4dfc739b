"""The VS Code extension compiles and packages into a .vsix with its language client."""

from __future__ import annotations

import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

EXTENSION = Path(__file__).parents[2] / "editors" / "vscode"


def test_extension_compiles_and_packages(tmp_path):
    npm, npx = shutil.which("npm"), shutil.which("npx")
    if npm is None or npx is None:
        pytest.skip("node and npm are needed (Debian: apt install nodejs npm)")
    work = tmp_path / "vscode"
    shutil.copytree(EXTENSION, work, ignore=shutil.ignore_patterns("node_modules", "out", "*.vsix"))
    for command in ([npm, "ci", "--no-audit", "--no-fund"], [npm, "run", "compile"],
                    [npx, "vsce", "package", "--out", "codespec.vsix"]):
        done = subprocess.run(command, cwd=work, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, f"{' '.join(command[1:])} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
    with zipfile.ZipFile(work / "codespec.vsix") as vsix:
        names = set(vsix.namelist())
    assert "extension/out/extension.js" in names
    assert "extension/package.json" in names
    assert any(n.startswith("extension/node_modules/vscode-languageclient/") for n in names)
    assert not any(n.startswith("extension/src/") for n in names)
