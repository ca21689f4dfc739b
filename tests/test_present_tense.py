"""The product speaks of itself in the present: no tracked file, and no tracked file's
name, mentions the work sessions, stops or issue numbers it was built in. History lives
in git; a figure names its machine and its date or commit instead."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
# built from pieces, so that this file does not match itself
WORDS = "|".join(("sess" + "ions?", "iss" + "ues?", "st" + "ops?"))
# on one line, or broken across two (a comment's or docstring's wrapped line)
MENTION = re.compile(rf"\b(?:{WORDS})(?:[ -]|\s*\n[ \t]*(?:#|//|\*)?[ \t]*)#?[0-9]+", re.IGNORECASE)
NAME = re.compile(r"(?:sess" + r"ion|[-_]s)[0-9]+(?=[-_.])", re.IGNORECASE)


def tracked() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [name for name in out.stdout.decode().split("\0") if name]


def test_no_tracked_file_names_a_work_session_or_an_issue():
    found = []
    for name in tracked():
        path = ROOT / name
        if NAME.search(Path(name).name):
            found.append(f"{name}: its name")
        if not path.is_file() or path.is_symlink():
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192]:
            continue  # binary
        text = data.decode("utf-8", errors="replace")
        for hit in MENTION.finditer(text):
            number = text.count("\n", 0, hit.start()) + 1
            found.append(f"{name}:{number}: {hit.group()!r}")
    assert not found, "\n".join(found[:40])
