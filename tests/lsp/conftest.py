"""A real repository for the language server tests: a copy of the stdlib `json`
package plus a vendored copy of its decoder (so the index has the answer), with the
body of `JSONDecoder.decode` cut out of the file the editor opens."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

CUT_FILE = "json/decoder.py"


def make_repo(root: Path) -> tuple[Path, str, int]:
    """(repository root, the open file's text, the line where the body starts)."""
    package = Path(json.__file__).parent
    shutil.copytree(package, root / "json", ignore=shutil.ignore_patterns("__pycache__"))
    (root / "vendor").mkdir()
    shutil.copy(package / "decoder.py", root / "vendor" / "json_decoder.py")
    source = (package / "decoder.py").read_text(encoding="utf-8")
    start = source.index("    def decode(self, s, _w=WHITESPACE.match):")
    doc_end = source.index('"""', source.index('"""', start) + 3) + 4  # past the docstring's line
    body_end = source.index("\n\n", doc_end)
    text = source[:doc_end] + "        \n" + source[body_end:]
    (root / CUT_FILE).write_text(text, encoding="utf-8")
    return root, text, text[:doc_end].count("\n")


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    return make_repo(tmp_path_factory.mktemp("workspace"))
