"""The scheduler: one worker thread drives every active request, one step at a time.

Front ends (the HTTP server, the language server) `submit` a request and get a
`Ticket`; the worker interleaves the active runs round-robin (each `step()` is a prefill
or one verify pass), reports committed tokens through the ticket's callbacks, and drops
a run at once when its ticket is cancelled (a client that disconnected, a newer
keystroke). Runs have their own KV caches, so interleaving never changes an output: a
request's tokens are exactly those it gets alone. The verifier issue replaces the
round-robin with batched verification; the interface stays.

    ticket = scheduler.submit(prompt_ids, config, on_tokens=print, on_done=print)
    ticket.cancel()
"""

from __future__ import annotations

import collections
import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from codespec.engine import Engine, Generation, GenerationConfig, Run
from codespec.errors import CodespecError

log = logging.getLogger("codespec.scheduler")
OnTokens = Callable[[list[int]], None]
OnDone = Callable[["Generation | BaseException"], None]


class SchedulerFull(CodespecError):
    """Too many requests are waiting; the client should retry later."""


@dataclass
class Ticket:
    prompt_ids: Sequence[int]
    config: GenerationConfig
    on_tokens: OnTokens
    on_done: OnDone
    cancelled: threading.Event = field(default_factory=threading.Event)

    def cancel(self) -> None:
        self.cancelled.set()


class Scheduler:
    def __init__(self, engine: Engine, max_active: int = 4, max_waiting: int = 64) -> None:
        self.engine = engine
        self.max_active = max_active
        self.max_waiting = max_waiting
        self._waiting: collections.deque[Ticket] = collections.deque()
        self._active: list[tuple[Ticket, Run]] = []
        self._wake = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="codespec-scheduler", daemon=True)
        self._thread.start()

    # -- front-end side ------------------------------------------------------------------
    def submit(self, prompt_ids: Sequence[int], config: GenerationConfig, on_tokens: OnTokens,
               on_done: OnDone) -> Ticket:
        ticket = Ticket(list(prompt_ids), config, on_tokens, on_done)
        with self._wake:
            # a submitted ticket waits until the worker admits it, so free slots count too
            free_slots = max(0, self.max_active - len(self._active))
            if len(self._waiting) >= self.max_waiting + free_slots:
                raise SchedulerFull(f"{len(self._waiting)} requests are already waiting; retry shortly")
            self._waiting.append(ticket)
            self._wake.notify()
        return ticket

    @property
    def queue_depth(self) -> int:
        return len(self._waiting)

    @property
    def active(self) -> int:
        return len(self._active)

    def close(self) -> None:
        with self._wake:
            self._stopping = True
            self._wake.notify()
        self._thread.join(timeout=30)

    # -- worker side ---------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._wake:
                while not self._stopping and not self._waiting and not self._active:
                    self._wake.wait()
                if self._stopping:
                    return
                while self._waiting and len(self._active) < self.max_active:
                    self._admit(self._waiting.popleft())
            for entry in list(self._active):
                self._step(*entry)

    def _admit(self, ticket: Ticket) -> None:
        if ticket.cancelled.is_set():
            return
        try:
            run = self.engine.start(ticket.prompt_ids, ticket.config)
        except Exception as exc:  # a bad request fails alone
            _notify(ticket, ticket.on_done, exc)
            return
        self._active.append((ticket, run))

    def _step(self, ticket: Ticket, run: Run) -> None:
        if ticket.cancelled.is_set():
            self._active.remove((ticket, run))  # its KV cache goes with it
            return
        try:
            tokens = run.step()
        except Exception as exc:  # an engine failure ends this request, not the server
            self._active.remove((ticket, run))
            _notify(ticket, ticket.on_done, exc)
            return
        if tokens:
            _notify(ticket, ticket.on_tokens, tokens)
        if run.done or ticket.cancelled.is_set():
            self._active.remove((ticket, run))
            if run.done:
                _notify(ticket, ticket.on_done, run.result())


def _notify(ticket: Ticket, callback: Callable[[Any], None], value: Any) -> None:
    """A front end that can no longer listen (its event loop closed) loses its request;
    the worker keeps serving everyone else."""
    try:
        callback(value)
    except Exception:
        log.warning("dropping a request whose listener failed", exc_info=True)
        ticket.cancel()
