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
    scheduler.prefill_ahead("file.py", likely_prompt_ids)   # idle time: its chunks, for later

Idle time is not wasted: `prefill_ahead` hands in prompts a front end expects soon (the
language server: the document just opened or edited, at its cursor); while no request
is waiting or active, the worker computes their KV a chunk at a time, newest first, and
a request that comes meanwhile pre-empts the chunk in progress (Engine.prefill_ahead).
"""

from __future__ import annotations

import collections
import logging
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

from codespec.engine.engine import Engine, Generation, GenerationConfig, Run
from codespec.errors import CodespecError

if TYPE_CHECKING:
    from codespec.forward.select import Loaded
    from codespec.index import SuffixIndex
    from codespec.settings import Settings

log = logging.getLogger("codespec.engine.scheduler")
AHEAD_KEEP = 4  # prompts kept for prefilling ahead (one per document); the oldest go first
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
    run: Run | None = None  # once admitted: its stats (prompt tokens, cached ones) are readable

    def cancel(self) -> None:
        self.cancelled.set()


class Scheduler:
    """`engine` is an Engine, or a function that builds one: a server passes the
    function, so that loading the model, calibrating and every step run on the worker
    thread. Why: torch's CPU thread pool (OpenMP) belongs to the thread that first uses
    it; a second thread running torch gets a second pool, and with more pool threads
    than cores every parallel region wakes its helpers the slow way. Measured here (2
    cores): a decode step took 86 ms on the model's thread and 105 ms on another; a
    batch-8 pass 134 vs 225 ms. With `thread=False` there is no worker: the caller
    runs the submitted requests on its own thread with `drain()` (the benchmark)."""

    def __init__(self, engine: Engine | Callable[[], Engine], max_active: int = 4, max_waiting: int = 64,
                 *, thread: bool = True) -> None:
        self.max_waiting = max_waiting
        self._max_active = max_active
        self._waiting: collections.deque[Ticket] = collections.deque()
        self._active: list[tuple[Ticket, Run]] = []
        self._ahead: collections.OrderedDict[str, list[int]] = collections.OrderedDict()  # key -> prompt, newest last
        self.ahead_tokens = self.ahead_preempted = 0  # prompt tokens computed ahead; passes pre-empted
        self._wake = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        if not thread:
            self._use(engine)
            return
        ready, failed = threading.Event(), []

        def work() -> None:
            try:
                self._use(engine)
            except BaseException as exc:  # raised in the constructor's thread below
                failed.append(exc)
                return
            finally:
                ready.set()
            self._loop()

        self._thread = threading.Thread(target=work, name="codespec-scheduler", daemon=True)
        self._thread.start()
        ready.wait()
        if failed:
            raise failed[0]

    def _use(self, engine: Engine | Callable[[], Engine]) -> None:
        self.engine = engine if isinstance(engine, Engine) else engine()
        self.max_active = min(self._max_active, self.engine.cache.slots)

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

    def prefill_ahead(self, key: str, prompt_ids: Sequence[int] | None) -> None:
        """Prefill `prompt_ids` in idle time (replacing what `key` asked before; None
        forgets it): low priority, every request comes first (module docstring)."""
        with self._wake:
            self._ahead.pop(key, None)
            if prompt_ids:
                self._ahead[key] = [int(t) for t in prompt_ids]
                while len(self._ahead) > AHEAD_KEEP:
                    self._ahead.popitem(last=False)
                self._wake.notify()

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
        if self._thread is not None:
            self._thread.join(timeout=30)

    def drain(self) -> None:
        """Run every submitted request to its end on the calling thread (a scheduler
        made with `thread=False`)."""
        if self._thread is not None:
            raise RuntimeError("this scheduler has a worker thread; drain() is for thread=False")
        while True:
            with self._wake:
                self._admit_waiting()
            if not self._active:
                return
            self._step()

    # -- worker side ---------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._wake:
                while not self._stopping and not self._waiting and not self._active and not self._ahead:
                    self._wake.wait()
                if self._stopping:
                    return
                self._admit_waiting()
                ahead = next(reversed(self._ahead.items())) if self._ahead and not self._active else None
            if ahead is not None:
                self._prefill_ahead(*ahead)
                continue
            try:
                self._step()
            except Exception as exc:  # a defect outside any one run: end the active requests, keep serving
                log.error("a scheduler step failed; its requests end with the error", exc_info=True)
                self._fail_active(exc)

    def _prefill_ahead(self, key: str, prompt: list[int]) -> None:
        """One prefill pass of the newest prompt asked ahead; it is forgotten once all its
        passes are cached (or cannot be: no free slot, a failure)."""
        try:
            computed = self.engine.prefill_ahead(prompt, preempted=lambda: bool(self._waiting) or self._stopping)
        except Exception:
            log.warning("prefilling ahead failed; dropped", exc_info=True)
            computed = None
        if computed is None:
            with self._wake:
                if self._ahead.get(key) is prompt:
                    del self._ahead[key]
        elif computed:
            self.ahead_tokens += computed
        else:
            self.ahead_preempted += 1

    def _fail_active(self, exc: BaseException) -> None:
        for ticket, run in self._active:
            try:
                run.close()
            except Exception:
                log.debug("closing a failed run", exc_info=True)
            _notify(ticket, ticket.on_done, exc)
        self._active.clear()

    def _admit_waiting(self) -> None:
        while self._waiting and len(self._active) < self.max_active:
            self._admit(self._waiting.popleft())

    def _admit(self, ticket: Ticket) -> None:
        if ticket.cancelled.is_set():
            return
        try:
            run = self.engine.start(ticket.prompt_ids, ticket.config)
        except Exception as exc:  # a bad request fails alone
            _notify(ticket, ticket.on_done, exc)
            return
        ticket.run = run
        self._active.append((ticket, run))

    def _step(self) -> None:
        for ticket, run in [e for e in self._active if e[0].cancelled.is_set()]:
            run.close()  # its slot frees at once; the KV stays cached
            self._active.remove((ticket, run))
        new = [e for e in self._active if not e[1].prefilled][:1]  # one prefill per step
        batch = new + [e for e in self._active if e[1].prefilled]
        if not batch:
            return
        # a prefill next step (another request admitted, not yet prefilled, or one waiting
        # for a slot) would drop a plain step queued behind this one (forward/cuda/chained.py)
        prefill_next = len([e for e in self._active if not e[1].prefilled]) > len(new) or bool(self._waiting)
        outs = self.engine.step([run for _, run in batch], prefill_next=prefill_next)
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
    """A front end whose listener fails loses its request; it is told once, through
    `on_done`, so that nobody waits for an answer that will never come (a listener that
    failed on tokens and never heard again left the language server's request hanging);
    the worker keeps serving everyone else."""
    try:
        callback(value)
    except Exception as exc:
        log.warning("dropping a request whose listener failed", exc_info=True)
        if not ticket.cancelled.is_set():
            ticket.cancel()
            if callback is not ticket.on_done:
                try:
                    ticket.on_done(exc)
                except Exception:
                    log.debug("the failed listener's on_done failed too", exc_info=True)


def start_scheduler(settings: Settings, index: SuffixIndex, load: Callable[[], Loaded] | None = None,
                    ) -> tuple[Scheduler, Loaded]:
    """The serving chain that `serve` and `lsp` share: load the model (`load`, else the
    backend select.py picks for `settings`), build the engine over `index`, calibrate it
    (a no-op with a stored profile) and start continuous batching. All of it runs on the
    scheduler's thread, where every step runs (one thread pool for the model)."""
    found: dict[str, Loaded] = {}

    def build() -> Engine:
        from codespec.forward import select as forward
        from codespec.policy.warm import warm_up

        loaded = load() if load is not None else forward.load(settings, progress=False)
        found["loaded"] = loaded
        log.info("forward backend: %s (%s)", loaded.backend, loaded.reason)
        if loaded.degraded:
            log.warning("%s; the passes run on %s", loaded.degraded, loaded.backend)
        engine = Engine.from_settings(loaded.forward, loaded.tokenizer, settings, index=index)
        engine.calibrate()
        warm_up()  # the drafting kernels' first-use load, at start-up rather than in the first request
        return engine

    scheduler = Scheduler(build, settings.max_active_requests, settings.max_waiting_requests)
    return scheduler, found["loaded"]
