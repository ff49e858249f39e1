"""The change feed as server-sent events (``Accept: text/event-stream``): the framing, where
a stream resumes, and the response that writes it (docs/http-api.md, "Change feed as
server-sent events").

Same route, same shared poller, same cap as the JSON feed (:mod:`.feed`); only the framing
differs, so a browser's ``EventSource`` can follow a cell:

- one event per transaction: ``id:`` its txid, ``data:`` the feed record as one JSON line;
- ``retry:`` first, so ``EventSource`` reconnects after a short pause, with ``Last-Event-ID``
  (which wins over ``after=``): the stream ends after a bounded lifetime and resumes there;
- a comment (``: keep-alive``) whenever nothing was written for a heartbeat interval, so
  proxies keep the stream open and a client that is gone is noticed (the write fails);
- a failure once the stream started is one ``event: feed-error`` (the error body), then the
  end. Not ``error``: ``EventSource`` fires ``error`` itself for every lost connection.

A slow reader holds at most one page in memory: a write waits while the socket's buffer is
full (uvicorn's flow control), and a reader that takes nothing for ``stall`` seconds is
disconnected, which gives its stream slot back.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from cellactors.errors import BadRequest
from cellactors.server.wire_limits import ABORT_EXTENSION
from cellactors.wire import codec

log = logging.getLogger("cellactors.server")

EVENT_STREAM = "text/event-stream"
#: The header a reconnecting ``EventSource`` sends: the id of the last event it received.
LAST_EVENT_ID = "last-event-id"
#: A comment line: ignored by every reader, but it is traffic on an idle stream.
KEEP_ALIVE = b": keep-alive\n\n"
#: The ``event:`` type of a failure after the stream started.
ERROR_EVENT = "feed-error"
MAX_TXID = 2**63 - 1


def wants_events(accept: str | None) -> bool:
    """The request's ``Accept`` names ``text/event-stream`` (what ``EventSource`` sends)."""
    if not accept:
        return False
    return any(part.split(";", 1)[0].strip().lower() == EVENT_STREAM for part in accept.split(","))


def resume_from(last_event_id: str | None, after: int) -> int:
    """Where a stream starts: after ``Last-Event-ID`` when the client sent one (a
    reconnecting ``EventSource``: it wins over the ``after`` its URL still carries), else
    after ``after``. An empty header counts as none (an event id may reset it to empty);
    anything but a txid is :class:`BadRequest`."""
    if last_event_id is None or not last_event_id.strip():
        return after
    raw = last_event_id.strip()
    # At most 19 digits before int(): a longer one is no txid, and Python refuses to
    # convert one of over 4,300 digits (a 500 where a 400 is due).
    if not raw.isascii() or not raw.isdigit() or len(raw) > 19 or int(raw) > MAX_TXID:
        raise BadRequest(f"Last-Event-ID {raw[:40]!r} is not a txid in [0, {MAX_TXID}]")
    return int(raw)


def retry_field(seconds: float) -> bytes:
    """The ``retry:`` field: how long ``EventSource`` waits before it reconnects."""
    return b"retry: %d\n\n" % max(0, round(seconds * 1000))


def change_event(txid: int, record: dict[str, Any]) -> bytes:
    """One transaction: its txid as the event id, its feed record as the data."""
    return b"id: %d\ndata: %s\n\n" % (txid, _line(record))


def error_event(body: dict[str, Any]) -> bytes:
    """A failure after the stream started: the error body an answer would carry."""
    return b"event: %s\ndata: %s\n\n" % (ERROR_EVENT.encode(), _line(body))


def _line(value: dict[str, Any]) -> bytes:
    """``value`` as JSON on one line (JSON escapes line breaks inside strings)."""
    data = codec.encode(value, "json")
    if b"\n" in data or b"\r" in data:  # never, but one would cut the event short
        raise ValueError("an event's data must be one line")
    return data


class _Writer:
    """Writes a stream's chunks one at a time (events and heartbeats never interleave);
    a write that cannot finish within ``stall`` seconds stops the stream."""

    def __init__(self, send: Send, stall: float, scope: anyio.CancelScope) -> None:
        self.send = send
        self.stall = stall
        self.scope = scope
        self.lock = anyio.Lock()
        self.last = time.monotonic()
        self.stalled = False

    async def put(self, chunk: bytes) -> None:
        with anyio.move_on_after(self.stall) as timer:
            async with self.lock:
                await self.send({"type": "http.response.body", "body": chunk, "more_body": True})
                self.last = time.monotonic()
        if timer.cancelled_caught:
            self.stalled = True
            self.scope.cancel()


class EventStreamResponse(StreamingResponse):
    """The feed's chunks as an event stream: ``retry:`` first, a heartbeat comment after
    every ``heartbeat`` seconds without a write, the client disconnected once a write
    waits ``stall`` seconds; ``release`` gives the stream's slot back however it ends."""

    media_type = EVENT_STREAM

    def __init__(
        self,
        content: AsyncIterator[bytes],
        release: Callable[[], None],
        *,
        heartbeat: float,
        retry: float,
        stall: float,
        headers: dict[str, str],
    ) -> None:
        # ``X-Accel-Buffering``: a proxy that buffers answers (nginx) passes this one on.
        super().__init__(content, headers={**headers, "X-Accel-Buffering": "no"})
        self.events = content
        self._release = release
        self.heartbeat = heartbeat
        self.retry = retry
        self.stall = stall

    #: Drops the connection at once (the listener's :data:`ABORT_EXTENSION`), if it has one.
    abort_connection: Callable[[], None] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.abort_connection = scope.get("extensions", {}).get(ABORT_EXTENSION)
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()

    async def stream_response(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        source = self.events
        try:
            with anyio.CancelScope() as scope:
                writer = _Writer(send, self.stall, scope)
                await writer.put(retry_field(self.retry))
                async with anyio.create_task_group() as group:
                    group.start_soon(self._beat, writer)
                    async for chunk in source:
                        await writer.put(chunk)
                    group.cancel_scope.cancel()
        finally:
            closing = getattr(source, "aclose", None)
            if closing is not None:  # leave the shared tail now, not when collected
                with anyio.CancelScope(shield=True):
                    await closing()
        if writer.stalled:
            # The answer is left incomplete on purpose, and the connection dropped: closed,
            # it would stay open (and counted) until its unread buffer drained.
            log.warning(
                "dropping a change feed event stream: its client read nothing for %ss", self.stall
            )
            if self.abort_connection is not None:
                self.abort_connection()
            return
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _beat(self, writer: _Writer) -> None:
        """A comment whenever nothing was written for ``heartbeat`` seconds."""
        while True:
            idle = time.monotonic() - writer.last
            if idle >= self.heartbeat:
                await writer.put(KEEP_ALIVE)
            else:
                await anyio.sleep(self.heartbeat - idle)
