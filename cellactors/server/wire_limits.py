"""Limits on the wire for one listener: the request head's size and header count, how long
a head, a body or an idle connection may take, and how many connections it holds at once.

uvicorn bounds none of these (its httptools parser buffers a header of any size, any number
of them, and waits for a slow head or body for ever; it closes only idle keep-alive
connections), so each listener serves through :class:`LimitedProtocol`, uvicorn's
httptools protocol with O(1) bookkeeping in the parser callbacks it already runs:

- a head over ``max_header_bytes`` or ``max_header_count`` is answered 431
  (``headers_too_large``) and the connection closed, checked as the head streams in;
- a head that has not arrived whole ``header_timeout`` seconds after its first byte, and a
  body not whole ``body_timeout`` seconds after its head, are cut off: 408
  (``request_timeout``) if nothing was answered yet, then the connection is closed;
- a new connection that sends nothing for ``keep_alive_timeout`` seconds is closed (uvicorn
  closes connections idle between requests after the same time);
- a connection over ``max_connections`` is answered 503 (``node_unavailable``, retryable)
  at once and closed; the listener serves the others as before.

Per request this costs a few attribute writes and one clock read; the deadlines are checked
by one task per listener (:meth:`WireGuard.sweep`) a few times a second, never by a timer
per request. Every refusal is counted (``cellactors_wire_refusals_total``).
"""

from __future__ import annotations

import asyncio
import http
import logging
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

from cellactors.actors.metrics import WIRE_LIMITS
from cellactors.errors import CallError, HeadersTooLarge, NodeUnavailable, RequestTimeout
from cellactors.wire import codec

log = logging.getLogger(__name__)

#: The limits, as the ``limit`` label of the refusals counter names them.
HEADER_BYTES, HEADER_COUNT, HEADER_TIMEOUT, BODY_TIMEOUT, IDLE_TIMEOUT, CONNECTIONS = WIRE_LIMITS
#: After a refusal the node stops writing (FIN) but reads and drops what the client still
#: sends for this long before closing: closing with unread bytes would reset the
#: connection, and the client could lose the answer that says its call never ran.
LINGER_S = 1.0
#: The sweep runs this often at most and at least (seconds), a quarter of the shortest
#: timeout in between.
SWEEP_MIN_S, SWEEP_MAX_S = 0.05, 1.0

# Where a connection is: no byte of a request yet (new), reading a head, reading a body,
# or a request read whole (the app answers it; uvicorn then times an idle keep-alive).
_NEW, _HEAD, _BODY, _READ = range(4)
_NEVER = math.inf


@dataclass(frozen=True)
class WireLimits:
    """The limits of one listener, as ``ServerSettings`` gives them (its defaults are the
    only ones; docs/http-api.md)."""

    max_header_bytes: int
    max_header_count: int
    header_timeout: float
    body_timeout: float
    keep_alive_timeout: float
    max_connections: int

    @property
    def sweep_interval(self) -> float:
        shortest = min(self.header_timeout, self.body_timeout, self.keep_alive_timeout)
        return max(SWEEP_MIN_S, min(SWEEP_MAX_S, shortest / 4))


class _Refused(Exception):
    """Raised in a parser callback to stop parsing a head over a limit."""


class WireGuard:
    """The limits of one listener: the protocol class uvicorn serves it with, the sweep that
    enforces its deadlines, and the count of its refusals."""

    def __init__(
        self,
        listener: str,
        limits: WireLimits,
        on_refused: Callable[[str, str], None] | None = None,
        retry_after: int = 1,
    ) -> None:
        self.listener = listener
        self.limits = limits
        self.retry_after = retry_after  # the Retry-After of the 503 over the cap
        self._on_refused = on_refused
        #: How many of the listener's connections are held sockets (upgraded): they have
        #: a cap of their own and do not count against ``max_connections``.
        self.held_sockets: Callable[[], int] = lambda: 0

    def refused(self, limit: str) -> None:
        """Count one refusal at ``limit`` (``cellactors_wire_refusals_total``)."""
        if self._on_refused is not None:
            self._on_refused(self.listener, limit)

    def protocol_class(self) -> type[LimitedProtocol]:
        """A :class:`LimitedProtocol` bound to this guard, for ``uvicorn.Config(http=...)``."""

        class Bound(LimitedProtocol):
            pass

        Bound.guard = self
        return Bound

    async def sweep(self, connections: Iterable[Any]) -> None:
        """Until cancelled: cut off the connections (uvicorn's ``server_state.connections``
        of this listener) whose head, body or first byte is overdue."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.limits.sweep_interval)
            now = loop.time()
            for conn in list(connections):
                if isinstance(conn, LimitedProtocol) and conn.deadline <= now:
                    try:
                        conn.expire(now)
                    except Exception:  # one connection's failure must not end the sweep
                        log.exception("cutting off an overdue connection failed")


#: The ASGI scope extension holding a callable that drops the request's connection at once
#: (a reset, its unsent buffer discarded), for an answer abandoned mid-stream.
ABORT_EXTENSION = "cellactors.abort"


class LimitedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the limits of :attr:`guard` (see the module)."""

    guard: ClassVar[WireGuard]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.deadline = _NEVER  # loop time by which the current phase must end
        self._phase = _NEW
        self._head_raw = 0  # bytes of chunks that ended inside the current head
        self._head_exact = 0  # bytes of its request target and complete headers
        self._header_count = 0
        self._messages = 0  # requests read whole on this connection
        self._refusal: str | None = None  # the limit this connection was refused at
        self._turned_away = False  # refused at connect (over the cap): never served

    # -- connections ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        limits = self.guard.limits
        if len(self.connections) - self.guard.held_sockets() >= limits.max_connections:
            self._turned_away = True
            self.transport = transport
            self._refuse(
                NodeUnavailable(
                    f"the {self.guard.listener} listener holds its most connections "
                    f"({limits.max_connections}); try another node or later"
                ),
                CONNECTIONS,
            )
            return
        super().connection_made(transport)
        self.deadline = self.loop.time() + limits.keep_alive_timeout

    def connection_lost(self, exc: Exception | None) -> None:
        if self._turned_away:
            return  # uvicorn never knew it
        super().connection_lost(exc)

    def timeout_keep_alive_handler(self) -> None:
        if not self.transport.is_closing():
            self.guard.refused(IDLE_TIMEOUT)
        super().timeout_keep_alive_handler()

    # -- reading -------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self._refusal is not None:
            return  # lingering after a refusal: drop what still comes
        in_head = self._phase in (_NEW, _HEAD)
        messages = self._messages
        super().data_received(data)
        # A head still incomplete: count the chunk if it held only head bytes (it began in
        # this head, or before any byte of it, and finished no request). The parser hands
        # over a header only once whole, so this is what bounds one that never ends.
        if self._phase == _HEAD and self._refusal is None:
            if in_head and messages == self._messages:
                self._head_raw += len(data)
            if self._head_raw > self.guard.limits.max_header_bytes:
                self._refuse_head(HEADER_BYTES)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._phase = _HEAD
        self.deadline = self.loop.time() + self.guard.limits.header_timeout
        self._head_raw = self._head_exact = self._header_count = 0

    def on_url(self, url: bytes) -> None:
        self._head_exact += len(url)
        if self._head_exact > self.guard.limits.max_header_bytes:
            self._stop(HEADER_BYTES)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        limits = self.guard.limits
        self._header_count += 1
        self._head_exact += len(name) + len(value) + 4  # ": " and CRLF
        if self._header_count > limits.max_header_count:
            self._stop(HEADER_COUNT)
        if self._head_exact > limits.max_header_bytes:
            self._stop(HEADER_BYTES)
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._phase = _BODY
        self.deadline = self.loop.time() + self.guard.limits.body_timeout
        # An app that gives up on a client that stopped reading drops the connection with
        # this: uvicorn would close it, which waits for the unread buffer to drain.
        self.scope.setdefault("extensions", {})[ABORT_EXTENSION] = self.transport.abort
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._phase = _READ
        self.deadline = _NEVER
        self._messages += 1
        super().on_message_complete()

    def _stop(self, limit: str) -> None:
        """Stop the parser inside a callback: uvicorn sees a parser error and calls
        :meth:`send_400_response`, which answers for this limit instead."""
        self._refusal = limit
        raise _Refused(limit)

    def send_400_response(self, msg: str) -> None:
        limit = self._refusal
        if limit is None:
            super().send_400_response(msg)
            return
        self._refusal = None
        self._refuse_head(limit)

    # -- deadlines -----------------------------------------------------------------------

    def expire(self, now: float) -> None:
        """The sweep found this connection's deadline passed: cut it off."""
        if self._refusal is not None or self.transport.is_closing():
            self.deadline = _NEVER
            return
        limits = self.guard.limits
        if self._phase == _NEW:
            self.guard.refused(IDLE_TIMEOUT)
            self.transport.close()
        elif self._phase == _BODY and self.flow.read_paused:
            # uvicorn stopped reading (the app has not taken the body yet, or a request
            # waits behind another): the client is not the slow one.
            self.deadline = now + limits.body_timeout
        elif self._phase == _HEAD:
            self._refuse(
                RequestTimeout(f"the request head took over {limits.header_timeout:g} s"),
                HEADER_TIMEOUT,
            )
        elif self._phase == _BODY:
            self._refuse(
                RequestTimeout(f"the request body took over {limits.body_timeout:g} s"),
                BODY_TIMEOUT,
            )
        self.deadline = _NEVER

    # -- refusing ------------------------------------------------------------------------

    def _refuse_head(self, limit: str) -> None:
        limits = self.guard.limits
        if limit == HEADER_COUNT:
            message = f"the request has over {limits.max_header_count} headers"
        else:
            message = f"the request head is over {limits.max_header_bytes} bytes"
        self._refuse(HeadersTooLarge(message), limit)

    def _refuse(self, err: CallError, limit: str) -> None:
        """Count the refusal, answer ``err`` unless another answer is on the wire, stop
        the request's app, then close the connection (after :data:`LINGER_S`)."""
        self._refusal = limit
        self.deadline = _NEVER
        self.guard.refused(limit)
        transport = self.transport
        cycle = self.cycle
        # A body still arriving after the app answered (it answered before reading it: a
        # refusal, an unknown cell) is only cut: its answer is on the wire already.
        idle = self._phase != _BODY and (cycle is None or cycle.response_complete)
        unanswered = self._phase == _BODY and not self.pipeline and not cycle.response_started
        if idle or unanswered:
            transport.write(self._answer(err))
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True  # the app reads a disconnect and sends nothing more
            cycle.message_event.set()
        if self.flow is not None:
            self.flow.resume_reading()  # keep draining the socket while lingering
        if transport.can_write_eof():
            transport.write_eof()
            self.loop.call_later(LINGER_S, transport.close)
        else:
            transport.close()

    def _answer(self, err: CallError) -> bytes:
        body = codec.encode_error(err, "json")
        lines = [
            f"HTTP/1.1 {err.status} {http.HTTPStatus(err.status).phrase}".encode("ascii"),
            *(name + b": " + value for name, value in self.server_state.default_headers),
            b"content-type: " + codec.CONTENT_TYPES["json"].encode("ascii"),
            b"content-length: %d" % len(body),
            b"connection: close",
        ]
        if err.status == 503:
            lines.append(b"retry-after: %d" % self.guard.retry_after)
        return b"\r\n".join(lines) + b"\r\n\r\n" + body


#: The ASGI scope extension of a socket holding a callable that writes one frame at once,
#: without a task or a wait, when the socket can take it (False: send it the usual way).
SEND_NOW_EXTENSION = "cellactors.send_now"


class AbortableSocket(WebSocketsSansIOProtocol):
    """uvicorn's WebSocket protocol with two extensions in each socket's scope:
    :data:`ABORT_EXTENSION` (a socket whose client stopped reading cannot even take its
    close frame, since the close waits for the buffer to drain: it is dropped instead) and
    :data:`SEND_NOW_EXTENSION` (a broadcast to a thousand sockets writes each frame straight
    to its transport, instead of a task and an ASGI send per socket)."""

    def handle_connect(self, event: Any) -> None:
        super().handle_connect(event)
        scope = getattr(self, "scope", None)
        if scope is not None:
            scope["extensions"][ABORT_EXTENSION] = self._abort
            scope["extensions"][SEND_NOW_EXTENSION] = self._send_now

    def _send_now(self, data: str | bytes) -> bool:
        """Write one frame now if the socket is open and its transport not paused (what
        uvicorn's own send waits for); False: nothing was written."""
        if (
            self.disconnected
            or self.close_sent
            or not self.handshake_complete
            or self.initial_response is not None
            or not self.writable.is_set()
            or self.transport.is_closing()
        ):
            return False
        if isinstance(data, bytes):
            self.conn.send_binary(data)
        else:
            self.conn.send_text(data.encode())
        self.transport.write(b"".join(self.conn.data_to_send()))
        return True

    def _abort(self) -> None:
        if not self.transport.is_closing():
            self.transport.abort()
