"""The language server's log, sent to the editor as `window/logMessage`.

VS Code's language client writes everything a server prints on stderr into its output
channel marked `[error]`, start-up notes included. A message sent as `window/logMessage`
carries its level (error, warning, info, log), so the editor shows each line as what it
is. Records may come from any thread (the model's loader, the index builder): they are
handed to the event loop. pygls' own records are never sent this way: sending a message
logs one at debug level, which would send another.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Sequence

from lsprotocol import types

LEVELS = ((logging.ERROR, types.MessageType.Error), (logging.WARNING, types.MessageType.Warning),
          (logging.INFO, types.MessageType.Info))


def message_type(level: int) -> types.MessageType:
    """The LSP message type for a logging level.

    >>> message_type(logging.WARNING), message_type(logging.DEBUG)
    (<MessageType.Warning: 2>, <MessageType.Log: 4>)
    """
    return next((kind for floor, kind in LEVELS if level >= floor), types.MessageType.Log)


class EditorLog(logging.Handler):
    """Sends records to the editor once the server's event loop runs (`attach`); from
    then on the `quiet` handlers (stderr) pass fatal errors only."""

    def __init__(self, server: Any, quiet: Sequence[logging.Handler] = ()) -> None:
        super().__init__()
        self.server = server
        self.quiet = list(quiet)
        self.loop: asyncio.AbstractEventLoop | None = None

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        for handler in self.quiet:
            handler.setLevel(logging.CRITICAL)

    def emit(self, record: logging.LogRecord) -> None:
        if self.loop is None or self.loop.is_closed() or record.name.startswith("pygls"):
            return
        try:
            params = types.LogMessageParams(type=message_type(record.levelno), message=self.format(record))
            self.loop.call_soon_threadsafe(self.server.window_log_message, params)
        except Exception:  # noqa: BLE001 - logging must never raise
            self.handleError(record)
