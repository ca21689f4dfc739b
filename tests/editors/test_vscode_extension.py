"""The VS Code extension compiles, type-checks and packages into a small .vsix: one bundle
(esbuild) holding the extension and its language client, a LICENSE, no question asked."""

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
    # the README's commands; stdin closed, so a question (a missing LICENSE) fails the run
    for command in ([npm, "ci", "--no-audit", "--no-fund"], [npm, "run", "compile"],
                    [npx, "vsce", "package", "--out", "codespec.vsix"]):
        done = subprocess.run(command, cwd=work, capture_output=True, text=True, timeout=900,
                              stdin=subprocess.DEVNULL)
        assert done.returncode == 0, f"{' '.join(command[1:])} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
    with zipfile.ZipFile(work / "codespec.vsix") as vsix:
        names = set(vsix.namelist())
        bundle = vsix.read("extension/out/extension.js").decode()
    # one bundle (the extension and vscode-languageclient), not hundreds of loose files
    assert {"extension/out/extension.js", "extension/package.json", "extension/LICENSE.txt"} <= names, names
    assert len(names) <= 10, sorted(names)
    assert "LanguageClient" in bundle and 'require("vscode")' in bundle
    assert not any(n.startswith(("extension/node_modules/", "extension/src/")) for n in names)
