"""Start-up work: every numba kernel a drafting request runs, compiled or loaded from
numba's cache before the first request instead of inside it (serve and lsp at start-up,
the benchmarks before their first timed run)."""

from __future__ import annotations

import time

from codespec.index import warm as index_warm
from codespec.policy import fastchoice


def warm_up() -> float:
    """The index's draft paths (index/warm.py), then the goodput controller's batch
    choice (policy/fastchoice.py); returns the seconds."""
    began = time.perf_counter()
    index_warm.warm_up()
    fastchoice.warm_up()
    return time.perf_counter() - began
