"""The server's life: it ends with the editor that started it."""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import NoReturn

from codespec.tempfiles import alive

log = logging.getLogger("codespec.lsp")


def watch_parent(pid: int, every_s: float = 2.0) -> None:
    """End this process when the editor that started it (`processId`) is gone, as the LSP
    spec asks: an editor killed without `shutdown` (a closed browser tab of code-server)
    left a 2.5 GB server running for minutes."""
    def watch() -> None:
        while True:
            time.sleep(every_s)
            if not alive(pid):
                log.info("the editor (process %d) is gone: exiting", pid)
                exit_now()

    threading.Thread(target=watch, name="codespec-parent-watch", daemon=True).start()


def exit_now() -> NoReturn:
    """End the process now, its log flushed: threads loading a model or building an index
    must not keep it alive (`asyncio.run` and the interpreter would join them)."""
    logging.shutdown()
    os._exit(0)
