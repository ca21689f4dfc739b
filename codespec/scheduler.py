"""The scheduler: one worker thread drives every active request, one step at a time.

Front ends (the HTTP server, the language server) `submit` a request and get a
`Ticket`; the worker runs continuous batching: each step prefills at most one newly
admitted request and verifies every other active request in one batched pass
(`Engine.step`), reports committed tokens through the tickets' callbacks, and drops a
run at once when its ticket is cancelled (a client that disconnected, a newer
keystroke). Requests join and leave between any two steps. Every row of a pass is
computed as it would be alone (attention.py), so batching never changes an output: a
request's tokens are exactly those it gets alone. Active requests are capped by the
KV slots the engine has; the rest wait.

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
        self.max_active = min(max_active, engine.cache.slots)
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
            self._step()

    def _admit(self, ticket: Ticket) -> None:
        if ticket.cancelled.is_set():
            return
        try:
            run = self.engine.start(ticket.prompt_ids, ticket.config)
        except Exception as exc:  # a bad request fails alone
            _notify(ticket, ticket.on_done, exc)
            return
        self._active.append((ticket, run))

    def _step(self) -> None:
        for ticket, run in [e for e in self._active if e[0].cancelled.is_set()]:
            run.close()  # its slot frees at once; the KV stays cached
            self._active.remove((ticket, run))
        new = [e for e in self._active if not e[1].prefilled][:1]  # one prefill per step
        batch = new + [e for e in self._active if e[1].prefilled]
        if not batch:
            return
        outs = self.engine.step([run for _, run in batch])
        for (ticket, run), tokens in zip(batch, outs):
            if tokens:
                _notify(ticket, ticket.on_tokens, tokens)
            if run.done or ticket.cancelled.is_set():
                run.close()
                self._active.remove((ticket, run))
                if run.error is not None:  # an engine failure ends these requests, not the server
                    _notify(ticket, ticket.on_done, run.error)
                elif run.done:
                    _notify(ticket, ticket.on_done, run.result())


def _notify(ticket: Ticket, callback: Callable[[Any], None], value: Any) -> None:
    """A front end that can no longer listen (its event loop closed) loses its request;
    the worker keeps serving everyone else."""
    try:
        callback(value)
    except Exception:
        log.warning("dropping a request whose listener failed", exc_info=True)
        ticket.cancel()
