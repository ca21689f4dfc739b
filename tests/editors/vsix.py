"""The VS Code extension packaged as the README says (npm ci, compile, vsce package), from
a copy of editors/vscode, with stdin closed so that a question (a missing LICENSE) fails."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

EXTENSION = Path(__file__).parents[2] / "editors" / "vscode"


def package_extension(work: Path) -> Path:
    """Build `work/codespec.vsix`; skip the test where node and npm are missing."""
    npm, npx = shutil.which("npm"), shutil.which("npx")
    if npm is None or npx is None:
        pytest.skip("node and npm are needed (Debian: apt install nodejs npm)")
    shutil.copytree(EXTENSION, work, ignore=shutil.ignore_patterns("node_modules", "out", "*.vsix"))
    for command in ([npm, "ci", "--no-audit", "--no-fund"], [npm, "run", "compile"],
                    [npx, "vsce", "package", "--out", "codespec.vsix"]):
        done = subprocess.run(command, check=False, cwd=work, capture_output=True, text=True, timeout=900,
                              stdin=subprocess.DEVNULL)
        assert done.returncode == 0, f"{' '.join(command[1:])} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
    return work / "codespec.vsix"
