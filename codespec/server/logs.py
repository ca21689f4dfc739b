"""`codespec serve`'s log: on stderr, or in a file (`log_file`) that rotates.

    configure_server_logging("info", "/path/serve.log")   # before the server starts

Per-request lines (uvicorn's access log, which `codespec serve` turns on only at debug)
would otherwise log an editor's every keystroke. The file rotates at
`LOG_FILE_BYTES`, keeping `LOG_FILE_BACKUPS` old ones, so it stays bounded across a long
run and across restarts; it is opened without following a symlink, so a link planted
where the log goes cannot send the server's output elsewhere.
"""

from __future__ import annotations

import logging
import logging.handlers
import sys
from typing import IO

from codespec.tempfiles import open_no_follow

LOG_FILE_BYTES = 4 << 20
LOG_FILE_BACKUPS = 2
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class NoFollowRotatingFile(logging.handlers.RotatingFileHandler):
    """A rotating log file opened with O_NOFOLLOW (mode 0600): a symlink in its place is
    refused (OSError), not written through."""

    def _open(self) -> IO[str]:
        return open_no_follow(self.baseFilename, self.encoding)


def configure_server_logging(level_name: str, log_file: str = "") -> None:
    level = getattr(logging, level_name.upper())
    if log_file:
        handler: logging.Handler = NoFollowRotatingFile(log_file, maxBytes=LOG_FILE_BYTES,
                                                        backupCount=LOG_FILE_BACKUPS, encoding="utf-8")
    else:
        handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.captureWarnings(True)
