"""uvicorn around the app, with the guards a long-running endpoint needs.

    serve(app, settings, on_shutdown=backend.drain)   # blocks until SIGINT / SIGTERM

uvicorn's h11 protocol has no deadline for a request's headers or its body (a
connection that sends nothing, or a byte now and then, stays open for ever) and answers
an oversized header block with a 400 and a close that resets the client before it reads
the answer. `GuardedH11` adds them: a header deadline from connect (and again after
each response on a kept-alive connection), a body deadline from the end of the headers
(the app's request is cut, the client gets a 408), and a 431 for headers over
`max_header_bytes`, read to the end of what the client sends (a lingering close) so the
client sees it. Refusals are counted in the app's `codespec_requests_total`. On shutdown,
`on_shutdown` runs first, so open streams end with an error event instead of a cut.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from typing import Any, Callable

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from codespec.server.schemas import error_body
from codespec.settings import Settings

log = logging.getLogger("codespec.server")

LINGER_S = 2.0  # how long a refused connection's remaining bytes are read and dropped
_HEADERS_END = re.compile(rb"\n\r?\n")


TIMED_OUT = "codespec.timed_out"  # set in a request's scope whose body came too slowly: its 408 was sent


class GuardedH11(H11Protocol):
    header_timeout_s = 10.0
    body_timeout_s = 20.0
    max_header_bytes = 64 * 1024
    refused: Callable[[int], None] = staticmethod(lambda status: None)  # counts a refusal before any request

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._deadline: asyncio.TimerHandle | None = None
        self._body_deadline: asyncio.TimerHandle | None = None
        self._armed_for: Any = None
        self._refused = False
        self._arm()

    def _arm(self) -> None:
        self._disarm()
        self._armed_for = self.cycle  # disarmed once a request after this cycle has its headers
        self._deadline = self.loop.call_later(self.header_timeout_s, self._too_slow)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _too_slow(self) -> None:
        self._deadline = None
        if self.cycle is self._armed_for and not self.transport.is_closing():
            self.refused(408)
            self._refuse(408, f"no complete request headers within {self.header_timeout_s:g} s")

    def _body_too_slow(self) -> None:
        """The body did not arrive in time: the app's request sees the client leave (its
        own answer goes nowhere), the client gets a 408."""
        self._body_deadline = None
        if self.conn.their_state is not h11.SEND_BODY or self.transport.is_closing():
            return
        if self.cycle is not None:
            self.cycle.scope[TIMED_OUT] = True  # type: ignore[index]
            self.cycle.disconnected = True
            self.cycle.message_event.set()
        self._refuse(408, f"the request body did not arrive within {self.body_timeout_s:g} s of its headers")

    def _watch_body(self) -> None:
        sending = self.conn.their_state is h11.SEND_BODY
        if sending and self._body_deadline is None:
            self._body_deadline = self.loop.call_later(self.body_timeout_s, self._body_too_slow)
        elif not sending and self._body_deadline is not None:
            self._body_deadline.cancel()
            self._body_deadline = None

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # lingering: the client's remaining bytes are dropped
        if self.conn.their_state is h11.IDLE and self._headers_too_long(data):
            self._refuse(431, f"the request headers are over {self.max_header_bytes} bytes")
            return
        super().data_received(data)
        if self._deadline is not None and self.cycle is not self._armed_for:
            self._disarm()  # headers are in; the app's own time starts
        self._watch_body()

    def _headers_too_long(self, data: bytes) -> bool:
        """Whether the request line and headers run past `max_header_bytes` (a body sent
        in the same packets as its headers does not count)."""
        buffered = self.conn.trailing_data[0]
        if len(buffered) + len(data) <= self.max_header_bytes:
            return False
        head = (buffered[: self.max_header_bytes + 4] + data[: self.max_header_bytes + 4])[: self.max_header_bytes + 4]
        return _HEADERS_END.search(head) is None

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm()  # the next request's headers get the same deadline

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._body_deadline is not None:
            self._body_deadline.cancel()
        super().connection_lost(exc)

    def _refuse(self, status: int, message: str) -> None:
        """An OpenAI-style error, then a lingering close (a close with unread bytes would
        reset the connection before the client reads the answer)."""
        self._refused = True
        self._disarm()
        if self._body_deadline is not None:
            self._body_deadline.cancel()
        self._unset_keepalive_if_required()
        body = json.dumps(error_body(message, code="request_header_fields_too_large" if status == 431 else
                                     "request_timeout")).encode()
        reason = {408: b"Request Timeout", 431: b"Request Header Fields Too Large"}[status]
        self.transport.write(b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
                             b"connection: close\r\n\r\n%s" % (status, reason, len(body), body))
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(LINGER_S, self.transport.close)


def guarded_protocol(settings: Settings, refused: Callable[[int], None] | None = None) -> type[GuardedH11]:
    fields: dict[str, Any] = {"header_timeout_s": settings.header_timeout_s, "body_timeout_s": settings.body_timeout_s,
                              "max_header_bytes": settings.max_header_bytes}
    if refused is not None:
        fields["refused"] = staticmethod(refused)
    return type("GuardedH11", (GuardedH11,), fields)


def count_refused(app: Any) -> Callable[[int], None]:
    """A refusal before any request reached `app`, in its requests counter."""
    def count(status: int) -> None:
        backend = getattr(getattr(app, "state", None), "backend", None)
        if backend is not None:
            backend.metrics.requests.labels("unmatched", str(status)).inc()

    return count


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, on_shutdown: Callable[[], None] | None) -> None:
        super().__init__(config)
        self.on_shutdown = on_shutdown

    async def shutdown(self, sockets: Any = None) -> None:
        if self.on_shutdown is not None:
            self.on_shutdown()  # open streams end with an error event; new requests get 503
        await super().shutdown(sockets)


def server_config(app: Any, settings: Settings, **options: Any) -> uvicorn.Config:
    return uvicorn.Config(app, host=settings.host, port=settings.port,
                          http=guarded_protocol(settings, count_refused(app)),
                          timeout_keep_alive=settings.idle_timeout_s, timeout_graceful_shutdown=5,
                          h11_max_incomplete_event_size=settings.max_header_bytes, **options)


def server(app: Any, settings: Settings, on_shutdown: Callable[[], None] | None = None,
           **options: Any) -> uvicorn.Server:
    """The server unstarted (tests run it on a thread)."""
    return _Server(server_config(app, settings, **options), on_shutdown)


def serve(app: Any, settings: Settings, on_shutdown: Callable[[], None] | None = None, **options: Any) -> None:
    server(app, settings, on_shutdown, **options).run()
