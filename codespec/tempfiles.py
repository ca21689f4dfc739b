"""Temporary files for write-then-rename, named so a later run can clean up after a
killed one (each killed index build left a `.tmp` of up to 14 MB for ever).

    fd, tmp = temp_beside(path)      # `.<name>.<pid>.<random>.tmp` in path's folder
    ...write, fsync...
    os.replace(tmp, path)

`temp_beside` first removes the temporaries of `path` whose writer process is gone.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from pathlib import Path
from typing import IO



def temp_beside(path: Path) -> tuple[int, str]:
    """An open file descriptor and the name of a fresh temporary beside `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_orphans(path)
    return tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp", dir=path.parent)


def remove_orphans(path: Path) -> list[Path]:
    """Remove the temporaries of `path` left by processes that no longer run."""
    pattern = re.compile(re.escape(f".{path.name}.") + r"(\d+)\.[^.]+\.tmp")
    removed = []
    try:
        names = os.listdir(path.parent)
    except OSError:
        return removed
    for name in names:
        found = pattern.fullmatch(name)
        if found and not alive(int(found.group(1))):
            try:
                (path.parent / name).unlink()
                removed.append(path.parent / name)
            except OSError:
                pass  # another run removed it, or it is not ours to remove
    return removed


def alive(pid: int) -> bool:
    """Whether `pid` runs: here, a temporary's writer; also the editor that started a
    language server and a shared server's clients (lsp/). Another user's process counts
    as running; a zombie (a child that exited and was not reaped yet) does not."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError, IndexError):  # no /proc (macOS): signal 0 is the answer
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    return True


def open_no_follow(path: str, encoding: str | None = "utf-8") -> IO[str]:
    """`path` opened to append (created 0600), refusing a symlink in its place (OSError)
    rather than writing wherever it points."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    return os.fdopen(fd, "a", encoding=encoding)
