"""Plain decode steps queued one ahead, fed on the device (the cuda backend's
`launch(..., chain_next=True)`).

Why. A plain step's host work (its rows laid out, the launch, the copy of its choices
back, the engine committing and streaming them) runs while the GPU idles: on an H100 a
step's graph takes ~1.3 ms of device time and the host ~0.1 ms around it. When every
request of a pass will take a plain step next (speculation off, greedy), the backend
queues that next step right behind the pass, its tokens copied on the device from the
pass's choices. The engine then asks for exactly that step; the backend hands back the
queued step's choices and queues the one after, so the device always has a step to run.

Exact by construction: the queued step is the same replay of the same graph over the
same rows the engine would have asked for, its tokens the pass's own choices (the
engine's next pending tokens). When requests ended meanwhile, the others' rows are
still theirs (each row is exact alone). When the engine asks for anything else (a
request joined, a prefill or a compaction came first), the queued step is dropped: its
KV writes lie past each slot's committed length, where a rejected draft's lie, and its
choices are never read."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from codespec.forward.base import Requests
from codespec.forward.cuda.passlayout import PassRows


class Collect:
    """What waits for a pass's choices (`Forward.launch`'s result); keeps them once read,
    so a step queued on them can check that the engine asked for it.

    On CUDA the copy back is queued when the pass is, right behind it: a copy asked for
    only when the engine reads the choices would queue behind the step chained after the
    pass (one stream runs in order) and wait for that step too, so the device would idle
    through the host's work after every step, which chaining is there to hide
    (2026-11-27: plain decoding 1.58 ms a token on the H100 against a 1.29 ms graph)."""

    def __init__(self, choices: Any) -> None:
        self._choices = choices  # the rows' greedy choices: on CUDA, soon a pinned host copy
        self._copied: Any = None  # the CUDA event after that copy
        if getattr(choices, "is_cuda", False):
            import torch

            self._choices = choices.to("cpu", non_blocking=True)  # pinned: the copy is asynchronous
            self._copied = torch.cuda.Event()
            self._copied.record()
        self.result: list[int] | None = None

    def __call__(self) -> list[int]:
        if self.result is None:
            if self._copied is not None:
                self._copied.synchronize()  # the pass's one wait: its own end, not a later step's
            self.result = self._choices.tolist()
        return self.result


@dataclass
class Chained:
    """A plain step queued on the device behind the pass `fed_from`: each request's slot
    and start, one row each, its token that pass's choice for the request."""

    slots: tuple[int, ...]
    starts: tuple[int, ...]
    fed_from: Collect  # the pass whose choices are this step's tokens
    choices: Any  # this step's choices on the device (a copy: later replays overwrite the bucket's)
    collect: Collect = field(init=False)

    def __post_init__(self) -> None:
        self.collect = Collect(self.choices)

    def rows_for(self, requests: Requests) -> list[int] | None:
        """The queued rows `requests` asks for, in its order: each request's slot at its
        queued start, a one-row tree of the token the feeding pass chose for it (read by
        the engine already). A request that ended since leaves its row unread: rows are
        exact alone, so the others' choices stand. None where any request is not queued."""
        tokens = self.fed_from.result
        if tokens is None:
            return None
        return queued_rows(list(zip(self.slots, self.starts, tokens)), requests)


def queued_rows(queued: Sequence[tuple[int, int, int]], requests: Requests) -> list[int] | None:
    """The rows of a queued plain step, (slot, start, token) each, that `requests` asks
    for, in its order; None where any request is not one of them (Chained.rows_for)."""
    where = {row_key: row for row, row_key in enumerate(queued)}
    rows = []
    for slot, start, tree in requests:
        row = where.get((slot, start, tree.tokens[0])) if len(tree) == 1 else None
        if row is None:
            return None
        rows.append(row)
    return rows


def plain_steps(requests: Requests) -> bool:
    """A pass of one row per request (every request's pending token, no draft)."""
    return all(len(tree) == 1 for _, _, tree in requests)


def next_starts(requests: Requests) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The slots and starts of the plain step after a plain pass: one position further."""
    return tuple(slot for slot, _, _ in requests), tuple(start + 1 for _, start, _ in requests)


def step_rows(slots: Sequence[int], starts: Sequence[int]) -> PassRows:
    """The rows of a plain step of these requests, tokens left 0 (the device fills them)."""
    k = len(slots)
    return PassRows(np.zeros(k, dtype=np.int64), np.full(k, -1, dtype=np.int64), np.zeros(k, dtype=np.int64),
                    np.arange(k + 1, dtype=np.int64), np.asarray(slots, dtype=np.int64),
                    np.asarray(starts, dtype=np.int64))
