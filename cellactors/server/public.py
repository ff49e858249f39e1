"""The node's public app: ``POST /cells/{cls}/{name}/{method}`` takes calls from clients
(run here, or forwarded, signed, to the node that owns the cell: :mod:`.forward`),
``GET /cells/{cls}/{name}/changes`` serves a cell's change feed from the bucket on any
node, and ``GET /healthz`` answers health checks. It has no internal route at all."""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
import anyio.to_thread
import httpx
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from cellactors.core import keys
from cellactors.core.access import FEED_ROLE
from cellactors.core.principal import Principal
from cellactors.core.routing import reroutable, reroutable_error
from cellactors.errors import (
    BadRequest,
    BucketError,
    CallError,
    FeedHistoryMissing,
    FeedUnavailable,
    InvalidCellId,
    NotDurable,
    RemoteOwner,
    StaleRoute,
    UnknownCell,
    UnsupportedMediaType,
)
from cellactors.server import cors, forward
from cellactors.server.auth.admission import admit_call, admit_role
from cellactors.server.handling import (
    CELL_ROUTE,
    CHANGES_ROUTE,
    EXCEPTION_HANDLERS,
    NDJSON_TYPE,
    NODE_HEADER,
    SERVING,
    AnswerGuard,
    Core,
    NodeLike,
    ServerSettings,
    as_call_error,
    hand_over,
)
from cellactors.server.peer_keys import KeySource, PeerKeys
from cellactors.wire import codec
from cellactors.wire.unsent import NOT_SENT

log = logging.getLogger("cellactors.server")


@dataclass(frozen=True)
class _Call:
    """One call as the public app routes it."""

    cls_name: str
    name: str
    method: str
    kwargs: dict[str, Any]
    body: bytes
    encoding: codec.Encoding
    key: str | None
    caller: Principal | None


class _PublicCore(Core):
    """Public calls: run here, or forward once to the owner (and once more on stale route)."""

    def __init__(
        self, node: NodeLike, fleet_key: bytes | PeerKeys | KeySource, settings: ServerSettings
    ) -> None:
        super().__init__(node, fleet_key, settings)
        self._client: httpx.AsyncClient | None = None
        self.feed_limiter = anyio.CapacityLimiter(settings.max_concurrent_feeds)

    def client(self) -> httpx.AsyncClient:
        """The shared keep-alive client for forwards, created in the serving loop."""
        if self._client is None:
            s = self.settings
            self._client = httpx.AsyncClient(
                timeout=httpx.Timeout(s.forward_timeout, connect=s.forward_connect_timeout),
                limits=httpx.Limits(
                    max_connections=s.forward_max_connections,
                    max_keepalive_connections=min(64, s.forward_max_connections),
                    keepalive_expiry=5.0,
                ),
            )
        return self._client

    async def admitted_changes(self, request: Request) -> Response:
        """The change feed, for callers holding the ``feed`` role (or ``admin``) only: it
        shows every row a cell writes, not what its methods choose to answer."""
        try:
            admit_role(
                self.settings.authentication, FEED_ROLE, request.headers, "read the change feed"
            )
        except CallError as e:
            return self.error(e, codec.encoding_for(request.headers.get("accept")))
        return await self.handle_changes(request)

    async def handle_changes(self, request: Request) -> Response:
        """``GET /cells/{cls}/{name}/changes?after=TXID&wait=SECONDS``: the cell's
        acknowledged transactions after ``after`` from the bucket, streamed as NDJSON (or
        msgpack objects with ``Accept: application/msgpack``); with ``wait``, the stream
        stays open that long and carries new transactions as they are acknowledged."""
        encoding = codec.encoding_for(request.headers.get("accept"))
        try:
            cls_name = request.path_params["cls_name"]
            if cls_name not in self.node.classes:
                raise UnknownCell(f"no served cell class {cls_name!r}")
            cell_id = keys.make_cell_id(cls_name, request.path_params["name"])
            after = _number(request, "after", int, 0, 0, 2**63 - 1)
            wait = _number(request, "wait", float, 0.0, 0.0, self.settings.feed_max_wait)
            reader = self.node.feed_reader(cell_id)
            page = await self._read_feed(reader, after)
        except (CallError, InvalidCellId) as e:
            return self.error(as_call_error(e), encoding)
        media = codec.CONTENT_TYPES[encoding] if encoding == "msgpack" else NDJSON_TYPE
        return StreamingResponse(
            self._stream(reader, page, wait, encoding),
            media_type=media,
            headers={NODE_HEADER: self.node.node_id, "Cache-Control": "no-store"},
        )

    async def _read_feed(self, reader: Any, after: int) -> Any:
        """One bucket round of the feed in a worker thread; store failures as wire errors."""
        from cellactors.errors import FeedHole

        try:
            return await anyio.to_thread.run_sync(
                reader.read, after, self.settings.feed_page, limiter=self.feed_limiter
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
                page = await self._read_feed(reader, page.last_txid)
            except CallError as e:
                yield _record(e.to_dict(), encoding)
                return

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def handle_call(self, request: Request) -> Response:
        cls_name = request.path_params["cls_name"]
        name = request.path_params["name"]
        method = request.path_params["method"]
        encoding = codec.encoding_for(request.headers.get("content-type"))
        try:
            codec.check_call_type(request.headers.get("content-type"))
        except UnsupportedMediaType as e:
            return self.error(e, encoding, close=True)  # its body was never read
        try:
            key = codec.idempotency_key(request.headers.getlist(codec.IDEMPOTENCY_HEADER))
            self.check_target(cls_name, name, method)
            caller = admit_call(
                self.settings.authentication,
                self.node.classes[cls_name],
                name,
                method,
                request.headers,
            )
            body, kwargs = await self.read_kwargs(request, encoding)
            call = _Call(cls_name, name, method, kwargs, body, encoding, key, caller)
            return await self.route(request, call)
        except (CallError, InvalidCellId) as e:
            return self.error(as_call_error(e), encoding)

    async def route(self, request: Request, call: _Call) -> Response:
        """Run locally or forward. Only an answer proving that the call ran nowhere
        (``not_run``: stale route, unavailable or unreachable owner, owner restarted) makes
        this node forget its route and decide once more; never a third hop."""
        check = codec.ResultCheck(call.encoding)
        for attempt in (1, 2):
            hand_over(request)
            try:
                result = await self.run_call(
                    call.cls_name,
                    call.name,
                    call.method,
                    call.kwargs,
                    call.key,
                    check,
                    functools.partial(self._call, call, check),
                    call.caller,
                )
            except RemoteOwner as owner:
                answer, reroute = await self.forward(owner, call)
                if attempt == 1 and reroute:
                    # The call ran nowhere: forget the cached route and decide again from the
                    # bucket (the cell may be free now, or its owner restarted).
                    log.info(
                        "route to %s for %s:%s is stale; refreshing",
                        owner.node,
                        call.cls_name,
                        call.name,
                    )
                    await self.run(self.node.forget_route, call.cls_name, call.name)
                    continue
                return answer
            except Exception as e:  # every failure becomes an answer
                return self.error(as_call_error(e), call.encoding)
            return self.ok(result, call.encoding, check)
        raise AssertionError("unreachable")  # pragma: no cover

    def _call(self, call: _Call, check: codec.ResultCheck) -> Any:
        return self.node.call(
            call.cls_name,
            call.name,
            call.method,
            call.kwargs,
            forwarded=False,
            timeout=self.settings.call_timeout,
            key=call.key,
            result_check=check,
            caller=call.caller,
        )

    async def forward(self, owner: RemoteOwner, call: _Call) -> tuple[Response, bool]:
        """Send the call, signed for the owner's process, to its internal listener; pass its
        answer through. Returns the answer and whether the call provably ran nowhere because
        of the route (:mod:`cellactors.core.routing`: routing again is safe)."""
        encoding = call.encoding
        sent = forward.signed(
            self.key,
            self.node.node_id,
            owner,
            call.cls_name,
            call.name,
            call.method,
            call.body,
            encoding,
            idempotency_key=call.key,
            now=self.node.store_time(),
            caller=call.caller,
        )
        try:
            peer = await self.client().post(sent.url, content=sent.body, headers=sent.headers)
        except NOT_SENT as e:
            # Nothing was sent: the call did not run anywhere, another try is safe.
            return self.error(forward.unreachable(owner, e), encoding), True
        except httpx.HTTPError as e:
            # Sent (maybe in part), but no answer: the call may have run on the owner.
            return self.error(forward.lost(owner, e), encoding), False
        if peer.is_success:
            return _pass_through(peer, encoding), False
        payload = forward.error_payload(peer.content, peer.headers.get("content-type"))
        if payload is None:
            # Not an answer of ours (a proxy, or a crashed peer): it may have run there.
            log.error(
                "owner %s answered HTTP %d without an error body", owner.node, peer.status_code
            )
            err = NotDurable(
                f"owner {owner.node} answered HTTP {peer.status_code} without an error body; "
                "the call may or may not have run"
            )
            return self.error(err, encoding), False
        refused = forward.refusal(owner, peer.status_code, payload)
        if refused is not None:
            if isinstance(refused, StaleRoute):
                log.info("owner %s restarted since its route was cached", owner.node)
            else:
                log.error("peer %s refused our signature: %s", owner.node, payload.get("message"))
            return self.error(refused, encoding), reroutable_error(refused)
        return _pass_through(peer, encoding), reroutable(
            payload.get("error"), payload.get("outcome")
        )


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


def _pass_through(peer: httpx.Response, encoding: codec.Encoding) -> Response:
    """The owner's answer, unchanged: status, body, content type and our headers."""
    headers_out = {
        k: v for k, v in peer.headers.items() if k.lower() in ("retry-after", NODE_HEADER.lower())
    }
    return Response(
        peer.content,
        status_code=peer.status_code,
        headers=headers_out,
        media_type=peer.headers.get("content-type", codec.CONTENT_TYPES[encoding]),
    )


def build_public_app(
    node: NodeLike,
    fleet_key: bytes | PeerKeys | KeySource,
    settings: ServerSettings | None = None,
) -> Starlette:
    """The client-facing app: cell calls (run here or forwarded), change feeds and a health
    check."""
    core = _PublicCore(node, fleet_key, settings or ServerSettings())

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await core.aclose()

    routes = [
        Route(CHANGES_ROUTE, core.admitted_changes, methods=["GET"]),
        Route(CELL_ROUTE, core.handle_call, methods=["POST"]),
        Route("/healthz", core.healthz, methods=["GET"]),
    ]
    middleware = [Middleware(AnswerGuard, core=core)]
    if core.settings.cors_origins:
        middleware.append(cors.middleware(core.settings.cors_origins))
    app = Starlette(
        routes=routes,
        middleware=middleware,
        exception_handlers=EXCEPTION_HANDLERS,
        lifespan=lifespan,
    )
    app.state.core = core
    return app
