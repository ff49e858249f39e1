"""``GET /cells/{cls}/{name}/changes?after=TXID&wait=SECONDS``: a cell's change feed, read
from the bucket on any node (docs/feed.md, docs/http-api.md#change-feed).

Followers (``wait`` > 0) of one cell on this node share one poller: once caught up, they wait
on the cell's :class:`~cellactors.core.feed_tail.FeedTail`, and the first of them to find a
round due reads the bucket once for all; a follower behind what the tail keeps pages through
history with reads of its own, then joins. Nothing polls a cell nobody follows. At most
``ServerSettings.max_feed_streams`` follow at once; one more is refused with
``feed_unavailable`` (503, Retry-After), counted in ``cellactors_feed_streams_refused_total``.
With ``Accept: text/event-stream`` the same follow stream is framed as server-sent events
(:mod:`.feed_events`).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
import anyio.to_thread
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from cellactors.core import keys
from cellactors.core.feed_tail import FeedTail, Next
from cellactors.errors import (
    BadRequest,
    BucketError,
    CallError,
    FeedHistoryMissing,
    FeedHole,
    FeedUnavailable,
    InvalidCellId,
    UnknownCell,
)
from cellactors.server import feed_events
from cellactors.server.handling import (
    NDJSON_TYPE,
    NODE_HEADER,
    SERVING,
    NodeLike,
    ServerSettings,
    as_call_error,
    error_response,
)
from cellactors.wire import codec


class _SharedTail:
    """One cell's tail on this node, the reader its rounds use, and who follows it."""

    def __init__(self, tail: FeedTail, reader: Any) -> None:
        self.tail = tail
        self.reader = reader
        self.lock = anyio.Lock()  # held by the follower that performs the next round
        self.followers = 0
        self.error: CallError | None = None  # a failed round ends every follower


class _FeedResponse(StreamingResponse):
    """A feed stream that gives its slot back when it ends, however it ends (also when
    the client left before the first byte, so the body never started)."""

    def __init__(self, content: AsyncIterator[bytes], release: Callable[[], None], **kw: Any):
        super().__init__(content, **kw)
        self._release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()


class FeedRoute:
    """The change feed of one node's public app: its readers, its shared tails, its cap."""

    def __init__(self, node: NodeLike, settings: ServerSettings) -> None:
        self.node = node
        self.settings = settings
        self.limiter = anyio.CapacityLimiter(settings.max_concurrent_feeds)
        self.tails: dict[str, _SharedTail] = {}
        self.streams = 0  # open follow streams (``wait`` > 0)

    async def handle(self, request: Request, hidden: frozenset[str] = frozenset()) -> Response:
        """The feed after ``after``, streamed as NDJSON (or msgpack objects with ``Accept:
        application/msgpack``); with ``wait``, the stream stays open that long and carries
        new transactions as they are acknowledged. Rows of the ``hidden`` tables are left
        out of every record (the call log's keys, for readers who may not see them). With
        ``Accept: text/event-stream``, always a follow stream of server-sent events, resumed
        after ``Last-Event-ID`` when given."""
        events = feed_events.wants_events(request.headers.get("accept"))
        encoding = "json" if events else codec.encoding_for(request.headers.get("accept"))
        fmt = Format(encoding, hidden, events)
        following = False
        try:
            cls_name = request.path_params["cls_name"]
            if cls_name not in self.node.classes:
                raise UnknownCell(f"no served cell class {cls_name!r}")
            cell_id = keys.make_cell_id(cls_name, request.path_params["name"])
            after = _number(request, "after", int, 0, 0, feed_events.MAX_TXID)
            wait = _number(request, "wait", float, 0.0, 0.0, self.settings.feed_max_wait)
            if events:  # always a follow stream, resumed where EventSource left off
                after = feed_events.resume_from(
                    request.headers.get(feed_events.LAST_EVENT_ID), after
                )
                wait = wait or self.settings.feed_max_wait
            if wait > 0:
                self._reserve()
                following = True
            reader, page = None, None
            if not (following and self._tail_covers(cell_id, after)):
                reader = self.node.feed_reader(cell_id)
                page = await self._read(reader, after)
        except (CallError, InvalidCellId) as e:
            if following:
                self._release()
            return self._error(as_call_error(e), encoding)
        except BaseException:
            if following:  # an unexpected failure (answered 500 by the guard) holds no slot
                self._release()
            raise
        media = codec.CONTENT_TYPES[encoding] if encoding == "msgpack" else NDJSON_TYPE
        headers = {NODE_HEADER: self.node.node_id, "Cache-Control": "no-store"}
        if not following:
            assert reader is not None and page is not None
            body = self._pages(reader, page, fmt)
            return StreamingResponse(body, media_type=media, headers=headers)
        end = time.monotonic() + wait
        body = self._follow(cell_id, after, reader, page, end, fmt)
        if events:
            s = self.settings
            return feed_events.EventStreamResponse(
                body,
                self._release,
                heartbeat=s.feed_heartbeat,
                retry=s.feed_retry,
                stall=s.feed_stall_timeout,
                headers=headers,
            )
        return _FeedResponse(body, self._release, media_type=media, headers=headers)

    def _reserve(self) -> None:
        """Take a follow slot, or refuse: the node follows as many streams as it may."""
        limit = self.settings.max_feed_streams
        if self.streams >= limit:
            self.node.feed_stream_refused()
            raise FeedUnavailable(
                f"this node already serves {limit} change feed streams (max_feed_streams); "
                "ask another node, or again later"
            )
        self.streams += 1

    def _release(self) -> None:
        self.streams -= 1

    def _tail_covers(self, cell_id: str, after: int) -> bool:
        """The cell's shared tail proves the history after ``after`` readable and can serve
        it: no read of the request's own is needed."""
        shared = self.tails.get(cell_id)
        return (
            shared is not None
            and shared.error is None
            and after <= shared.tail.last
            and shared.tail.next_for(after) is not Next.OWN
        )

    def _error(self, err: CallError, encoding: codec.Encoding) -> Response:
        return error_response(err, encoding, self.node.node_id, self.settings.retry_after_seconds)

    async def _read(self, reader: Any, after: int) -> Any:
        """One bucket round of the feed in a worker thread; store failures as wire errors."""
        try:
            return await anyio.to_thread.run_sync(
                reader.read, after, self.settings.feed_page, limiter=self.limiter
            )
        except FeedHole as e:
            raise FeedHistoryMissing(str(e)) from e
        except BucketError as e:
            raise FeedUnavailable(f"could not read the bucket: {e}") from e

    def _full(self, page: Any) -> bool:
        return len(page.changes) >= self.settings.feed_page

    async def _pages(self, reader: Any, page: Any, fmt: Format) -> AsyncIterator[bytes]:
        """Without ``wait``: every page until caught up; a failure ends the stream with one
        error record."""
        while True:
            if page.changes:
                yield _records(page.changes, fmt)
            if not self._full(page):
                return
            try:
                page = await self._read(reader, page.last_txid)
            except CallError as e:
                yield _failure(e, fmt)
                return

    def _open(self, end: float) -> bool:
        return time.monotonic() < end and self.node.status == SERVING

    async def _follow(
        self,
        cell_id: str,
        after: int,
        reader: Any,
        page: Any,
        end: float,
        fmt: Format,
    ) -> AsyncIterator[bytes]:
        """With ``wait``: page on its own while behind, then follow the cell's shared tail
        until ``end`` or the node stops serving; a failure ends the stream with one error
        record."""
        pos = after
        try:
            while page is not None:  # its own reads, while behind
                if page.changes:
                    yield _records(page.changes, fmt)
                pos = page.last_txid
                if not self._full(page):
                    break
                if not self._open(end):
                    return
                page = await self._read(reader, pos)
        except CallError as e:
            yield _failure(e, fmt)
            return
        shared = self._join(cell_id, reader, page, pos)
        try:
            async for chunk in self._tail(shared, cell_id, pos, end, fmt):
                yield chunk
        finally:
            self._leave(cell_id, shared)

    def _join(self, cell_id: str, reader: Any, page: Any, pos: int) -> _SharedTail:
        """Follow the cell's shared tail; the first follower starts it from its own last
        page (and hands it its reader, which knows where the cell's history ends)."""
        shared = self.tails.get(cell_id)
        if shared is None or shared.error is not None:
            interval = self.settings.feed_poll_interval
            if page is not None:
                tail = FeedTail.starting(
                    page.after, page.changes, self.settings.feed_page, time.monotonic() + interval
                )
            else:
                tail = FeedTail.starting(pos, [], self.settings.feed_page, time.monotonic())
            shared = _SharedTail(tail, reader or self.node.feed_reader(cell_id))
            self.tails[cell_id] = shared
        shared.followers += 1
        return shared

    def _leave(self, cell_id: str, shared: _SharedTail) -> None:
        """The last follower to leave stops the cell's poller (nothing reads for it)."""
        shared.followers -= 1
        if shared.followers == 0 and self.tails.get(cell_id) is shared:
            del self.tails[cell_id]

    async def _tail(
        self, shared: _SharedTail, cell_id: str, pos: int, end: float, fmt: Format
    ) -> AsyncIterator[bytes]:
        """New transactions from the shared tail, or from reads of its own while behind
        what the tail keeps."""
        own: Any = None
        while True:
            if shared.error is not None:
                yield _failure(shared.error, fmt)
                return
            step = shared.tail.next_for(pos)
            if step is Next.TAKE:
                changes = shared.tail.after(pos)
                yield _records(changes, fmt)
                pos = changes[-1].txid
                continue
            if step is Next.OWN:
                own = own or self.node.feed_reader(cell_id)
                try:
                    page = await self._read(own, pos)
                except CallError as e:
                    yield _failure(e, fmt)
                    return
                if page.changes:
                    yield _records(page.changes, fmt)
                    pos = page.last_txid
                    continue
            if not self._open(end):
                return
            await self._next_round(shared, end)

    async def _next_round(self, shared: _SharedTail, end: float) -> None:
        """Wait for the cell's next round, until ``end`` at most. The first follower to get
        the lock performs it when due, once for all; one that leaves while waiting for it
        hands the round over to the next."""
        seen = shared.tail.rounds
        with anyio.move_on_after(max(0.0, end - time.monotonic())):
            async with shared.lock:
                if shared.tail.rounds != seen or shared.error is not None:
                    return  # another follower read it meanwhile
                delay = shared.tail.due - time.monotonic()
                if delay > 0:
                    await anyio.sleep(delay)
                with anyio.CancelScope(shield=True):  # a read once sent is never wasted
                    try:
                        page = await self._read(shared.reader, shared.tail.last)
                    except CallError as e:
                        shared.error = e
                        return
                    shared.tail.advanced(
                        page.changes,
                        self._full(page),
                        time.monotonic(),
                        self.settings.feed_poll_interval,
                    )


@dataclass(frozen=True)
class Format:
    """How one reader's records are written: the encoding, the tables left out, and
    whether as server-sent events (:mod:`.feed_events`) instead of records."""

    encoding: codec.Encoding
    hidden: frozenset[str] = frozenset()
    events: bool = False


def _records(changes: list[Any], fmt: Format) -> bytes:
    if fmt.events:
        return b"".join(
            feed_events.change_event(c.txid, _visible(c.to_wire(), fmt.hidden)) for c in changes
        )
    return b"".join(_record(_visible(c.to_wire(), fmt.hidden), fmt.encoding) for c in changes)


def _failure(err: CallError, fmt: Format) -> bytes:
    """The end of a stream that failed after it started: its error body."""
    if fmt.events:
        return feed_events.error_event(err.to_dict())
    return _record(err.to_dict(), fmt.encoding)


def _visible(record: dict[str, Any], hidden: frozenset[str]) -> dict[str, Any]:
    if hidden:
        record["changes"] = [r for r in record["changes"] if r["table"] not in hidden]
    return record


def _record(value: dict[str, Any], encoding: codec.Encoding) -> bytes:
    """One feed record: a JSON line, or one msgpack object."""
    body = codec.encode(value, encoding)
    return body if encoding == "msgpack" else body + b"\n"


N = TypeVar("N", int, float)


def _number(request: Request, name: str, kind: type[N], default: N, low: N, high: N) -> N:
    """A numeric query parameter within [low, high], or :class:`BadRequest`."""
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = kind(raw)
    except ValueError:
        raise BadRequest(f"query parameter {name}={raw!r} is not a number") from None
    if not low <= value <= high:
        raise BadRequest(f"query parameter {name}={raw} is outside [{low}, {high}]")
    return value
