"""``GET /cells/{cls}/{name}/changes?after=TXID&wait=SECONDS``: a cell's change feed, read
from the bucket on any node (docs/feed.md, docs/http-api.md#change-feed)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any, TypeVar

import anyio
import anyio.to_thread
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from cellactors.core import keys
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


class FeedRoute:
    """The change feed of one node's public app: its readers and their worker threads."""

    def __init__(self, node: NodeLike, settings: ServerSettings) -> None:
        self.node = node
        self.settings = settings
        self.limiter = anyio.CapacityLimiter(settings.max_concurrent_feeds)

    async def handle(self, request: Request) -> Response:
        """The feed after ``after``, streamed as NDJSON (or msgpack objects with ``Accept:
        application/msgpack``); with ``wait``, the stream stays open that long and carries
        new transactions as they are acknowledged."""
        encoding = codec.encoding_for(request.headers.get("accept"))
        try:
            cls_name = request.path_params["cls_name"]
            if cls_name not in self.node.classes:
                raise UnknownCell(f"no served cell class {cls_name!r}")
            cell_id = keys.make_cell_id(cls_name, request.path_params["name"])
            after = _number(request, "after", int, 0, 0, 2**63 - 1)
            wait = _number(request, "wait", float, 0.0, 0.0, self.settings.feed_max_wait)
            reader = self.node.feed_reader(cell_id)
            page = await self._read(reader, after)
        except (CallError, InvalidCellId) as e:
            return self._error(as_call_error(e), encoding)
        media = codec.CONTENT_TYPES[encoding] if encoding == "msgpack" else NDJSON_TYPE
        return StreamingResponse(
            self._stream(reader, page, wait, encoding),
            media_type=media,
            headers={NODE_HEADER: self.node.node_id, "Cache-Control": "no-store"},
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

    async def _stream(
        self, reader: Any, page: Any, wait: float, encoding: codec.Encoding
    ) -> AsyncIterator[bytes]:
        """Every page until caught up, then new transactions until ``wait`` has passed or
        the node stops serving; a failure ends the stream with one error record."""
        end = time.monotonic() + wait
        while True:
            if page.changes:
                yield b"".join(_record(c.to_wire(), encoding) for c in page.changes)
            full = len(page.changes) >= self.settings.feed_page
            if not full:
                left = end - time.monotonic()
                if left <= 0 or self.node.status != SERVING:
                    return
                await anyio.sleep(min(self.settings.feed_poll_interval, left))
            try:
                page = await self._read(reader, page.last_txid)
            except CallError as e:
                yield _record(e.to_dict(), encoding)
                return


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
