"""Two questions about other processes, asked by several parts of codespec: is a
process still running (temporaries of killed writers, the editor that started a
language server, the clients of a shared server), and which local port is free."""

from __future__ import annotations

import contextlib
import os
import socket
from pathlib import Path


def alive(pid: int) -> bool:
    """Whether `pid` runs. Another user's process counts as running; a zombie (a child
    that exited and was not reaped yet) does not."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError, IndexError):  # no /proc (macOS): signal 0 is the answer
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    return True


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
