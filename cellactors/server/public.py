"""The node's public app: ``POST /cells/{cls}/{name}/{method}`` takes calls from clients
(run here, or forwarded, signed, to the node that owns the cell: :mod:`.forward`),
``GET /cells/{cls}/{name}/changes`` is routed to the change feed (:mod:`.feed`),
``GET /openapi.json`` describes the calls and ``GET /docs`` shows that description
(:mod:`.docs_page`), and ``GET /healthz`` answers health checks. It has no internal route
at all."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from cellactors.core.access import ADMIN_ROLE, FEED_ROLE
from cellactors.core.principal import Principal
from cellactors.core.routing import reroutable, reroutable_error
from cellactors.core.sockets import CLOSE_GOING_AWAY as GOING_AWAY
from cellactors.errors import (
    CallError,
    InvalidCellId,
    NotDurable,
    RemoteOwner,
    StaleRoute,
    UnsupportedMediaType,
)
from cellactors.persistence.celldb.runtime_tables import RUNTIME_SQL
from cellactors.server import call_span, cors, docs_page, forward, socket_routes
from cellactors.server.auth.admission import admit_call, admit_role
from cellactors.server.cell_admin import CellAdmin
from cellactors.server.feed import FeedRoute
from cellactors.server.handling import (
    CELL_ROUTE,
    CHANGES_ROUTE,
    EXCEPTION_HANDLERS,
    NODE_HEADER,
    AnswerGuard,
    Core,
    NodeLike,
    ServerSettings,
    as_call_error,
    hand_over,
)
from cellactors.server.peer_keys import KeySource, PeerKeys
from cellactors.tracing import spans
from cellactors.wire import codec
from cellactors.wire.unsent import NOT_SENT

log = logging.getLogger("cellactors.server")

#: Tables of a cell's feed only an ``admin`` reads: the runtime's own (the call log of every
#: caller's idempotency keys, the outbox and dead letters with the callers they carry, the
#: alarm).
HIDDEN_TABLES = frozenset(RUNTIME_SQL)


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
        self.feed = FeedRoute(node, settings)

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
        """The change feed (:mod:`.feed`), for callers holding the ``feed`` role (or
        ``admin``) only: it shows every row a cell writes, not what its methods choose to
        answer."""
        auth = self.settings.authentication
        try:
            caller = admit_role(auth, FEED_ROLE, request.headers, "read the change feed")
        except CallError as e:
            return self.error(e, codec.encoding_for(request.headers.get("accept")))
        # The runtime's tables hold every caller's keys and names: for operators only.
        sees_keys = auth.open or (caller is not None and ADMIN_ROLE in caller.roles)
        return await self.feed.handle(request, frozenset() if sees_keys else HIDDEN_TABLES)

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def handle_call(self, request: Request) -> Response:
        """A client's call, in its server span: a caller's ``traceparent`` is its parent
        (and nothing else: it names no one and admits nothing)."""
        params = request.path_params
        cls_name, name, method = params["cls_name"], params["name"], params["method"]
        parent = spans.parent_from(request.headers.get(spans.TRACEPARENT))
        return await call_span.traced(
            parent, cls_name, name, method, lambda: self._handle_call(request)
        )

    async def _handle_call(self, request: Request) -> Response:
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
        of the route (:mod:`cellactors.core.routing`: routing again is safe). Its client span
        is the parent of the owner's (its ``traceparent`` is signed with the call)."""
        with spans.span("cellactors.forward", kind=spans.SpanKind.CLIENT, peer=owner.node) as span:
            answer, reroute = await self._forward(owner, call)
            span.outcome(call_span.answer_outcome(answer))
            return answer, reroute

    async def _forward(self, owner: RemoteOwner, call: _Call) -> tuple[Response, bool]:
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
            trace=spans.traceparent(),
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

    sockets = socket_routes.routes(core, node)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        hub = core.socket_hub
        watch = None
        if hub is not None:
            hub.bind(asyncio.get_running_loop())
            alive = functools.partial(socket_routes.owner_alive, core.client())
            watch = asyncio.create_task(hub.watch(alive, core.settings.socket_watch_interval))
        try:
            yield
        finally:
            if hub is not None:
                hub.close_all(GOING_AWAY, "this node is stopping; resume on another")
            if watch is not None:
                watch.cancel()
            await core.aclose()

    routes = [
        Route(CHANGES_ROUTE, core.admitted_changes, methods=["GET"]),
        Route(CELL_ROUTE, core.handle_call, methods=["POST"]),
        *CellAdmin(core, core.client).routes(),
        *sockets,
        Route("/healthz", core.healthz, methods=["GET"]),
        Route("/openapi.json", core.openapi, methods=["GET"]),
        *docs_page.routes(),
    ]
    middleware = [Middleware(AnswerGuard, core=core)]
    if core.settings.cors_origins:
        # Outermost: the guard's own answers (a 503 at shutdown, a 500) carry CORS headers
        # too, so a page reads their outcome instead of a network error.
        middleware.insert(0, cors.middleware(core.settings.cors_origins))
    app = Starlette(
        routes=routes,
        middleware=middleware,
        exception_handlers=EXCEPTION_HANDLERS,
        lifespan=lifespan,
    )
    app.state.core = core
    return app
