"""End-to-end with Microsoft's `vscode-languageserver-protocol` node client."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.lsp.conftest import CUT_FILE, make_repo

NODE_DIR = Path(__file__).parent / "node"


@pytest.mark.model
def test_vscode_languageserver_protocol_client(tmp_path):
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("node and npm are needed (Debian: apt install nodejs npm)")
    if not (NODE_DIR / "node_modules" / "vscode-languageserver-protocol").is_dir():
        subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=NODE_DIR, check=True, timeout=600)
    root, _, body_line = make_repo(tmp_path)
    done = subprocess.run(
        [node, "client.js", str(root), CUT_FILE, str(body_line), "8"], cwd=NODE_DIR,
        env={**os.environ, "PYTHON": sys.executable}, capture_output=True, text=True, timeout=900,
    )
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout + done.stderr[-3000:]
