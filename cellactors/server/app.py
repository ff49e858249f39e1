"""The node's two HTTP apps.

*Public* (``POST /cells/{cls}/{name}/{method}``, ``GET /healthz``) takes calls from clients
and forwards them, signed, to the owning node when the runtime says another live node owns
the cell. *Internal* (``POST /internal/cells/...``, ``GET /state``, ``GET /metrics``,
``GET /healthz``) takes signed forwarded calls from peers plus operator endpoints; it must
listen on a private address. The public app has no internal route at all.

Calls into the node block (the answer waits for durability), so they run in worker threads
under a capacity limiter: a slow cell never blocks the event loop or health checks.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar
from urllib.parse import quote

import anyio
import anyio.to_thread
import httpx
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from cellactors.errors import (
    NOT_RUN,
    BadRequest,
    CallError,
    InvalidCellId,
    NodeUnavailable,
    NotDurable,
    RemoteOwner,
    StaleRoute,
    UnknownCell,
)
from cellactors.server import codec, signing

log = logging.getLogger("cellactors.server")

T = TypeVar("T")

NODE_HEADER = "X-Cellactors-Node"
CELL_ROUTE = "/cells/{cls_name}/{name}/{method}"
INTERNAL_CELL_ROUTE = "/internal/cells/{cls_name}/{name}/{method}"
SERVING = "serving"


class NodeLike(Protocol):
    """What the HTTP layer needs from the runtime (``cellactors.actors.node.Node``)."""

    node_id: str
    generation: str
    status: str
    classes: dict[str, type]

    def call(
        self,
        cls_name: str,
        name: str,
        method: str,
        kwargs: dict[str, Any],
        *,
        forwarded: bool = False,
        timeout: float = 30.0,
    ) -> Any: ...

    def state(self) -> dict[str, Any]: ...

    def metrics_text(self) -> str: ...

    def drain(self) -> None: ...

    def forget_route(self, cls_name: str, name: str) -> None: ...


@dataclass(frozen=True)
class ServerSettings:
    """Tunables of the HTTP layer (the defaults suit production)."""

    max_body_bytes: int = codec.DEFAULT_MAX_BODY
    max_concurrent_calls: int = 256  # worker threads blocked in node.call, per app
    call_timeout: float = 30.0  # passed to node.call
    forward_timeout: float = 40.0  # whole forwarded request; above call_timeout on purpose
    forward_connect_timeout: float = 3.0
    forward_max_connections: int = 512
    signature_window: float = signing.DEFAULT_WINDOW
    nonce_cache_size: int = 100_000
    retry_after_seconds: int = 1
    keep_alive_timeout: float = 75.0  # server side; longer than typical client pool expiry
    graceful_timeout: float = 60.0  # after drain, how long in-flight requests may take
    fence_poll_interval: float = 0.5  # runner checks node.status this often


class PeerRefused(CallError):
    """The owning peer refused our signed forward (key or clock mismatch); not executed."""

    status = 502
    code = "peer_refused"
    outcome = NOT_RUN


class InternalError(CallError):
    """An unexpected failure inside this node; the call's outcome is unknown."""

    status = 500
    code = "internal"


def error_response(
    err: CallError, encoding: codec.Encoding, node_id: str, retry_after: int = 1
) -> Response:
    """A machine-readable error answer; 503s carry Retry-After."""
    headers = {NODE_HEADER: node_id}
    if err.status == 503:
        headers["Retry-After"] = str(retry_after)
    if isinstance(err, codec.PayloadTooLarge) and not err.drained:
        headers["Connection"] = "close"
    return Response(
        codec.encode_error(err, encoding),
        status_code=err.status,
        media_type=codec.CONTENT_TYPES[encoding],
        headers=headers,
    )


def _as_call_error(exc: BaseException) -> CallError:
    """Map what node.call may raise onto the wire error."""
    if isinstance(exc, CallError):
        return exc
    if isinstance(exc, InvalidCellId):
        return BadRequest(str(exc))
    return InternalError(f"{type(exc).__name__}: {exc}")


class _Core:
    """State shared by the handlers of one app: node, key, settings, limiter."""

    def __init__(self, node: NodeLike, fleet_key: bytes, settings: ServerSettings) -> None:
        if len(fleet_key) != signing.KEY_BYTES:
            raise ValueError(f"the fleet key must be {signing.KEY_BYTES} bytes")
        self.node = node
        self.key = fleet_key
        self.settings = settings
        self.limiter = anyio.CapacityLimiter(settings.max_concurrent_calls)

    async def run(self, func: Callable[..., T], *args: Any) -> T:
        """Run a blocking node method in a worker thread under the call limiter."""
        return await anyio.to_thread.run_sync(func, *args, limiter=self.limiter)

    def error(self, err: CallError, encoding: codec.Encoding) -> Response:
        return error_response(err, encoding, self.node.node_id, self.settings.retry_after_seconds)

    def ok(self, result: Any, encoding: codec.Encoding) -> Response:
        try:
            body = codec.encode_result(result, encoding)
        except (TypeError, ValueError, OverflowError) as e:
            # The call already ran (and is durable): say so rather than invite a retry.
            log.error("result of a call is not encodable as %s: %s", encoding, e)
            return self.error(
                InternalError(f"the call succeeded but its result is not {encoding}: {e}"),
                encoding,
            )
        return Response(
            body,
            media_type=codec.CONTENT_TYPES[encoding],
            headers={NODE_HEADER: self.node.node_id},
        )

    async def read_kwargs(
        self, request: Request, encoding: codec.Encoding
    ) -> tuple[bytes, dict[str, Any]]:
        body = await codec.read_body(
            request.stream(), request.headers.get("content-length"), self.settings.max_body_bytes
        )
        return body, codec.decode_kwargs(body, encoding)

    def check_target(self, cls_name: str, method: str) -> None:
        """Refuse unknown classes and private methods before touching a thread."""
        if cls_name not in self.node.classes:
            raise UnknownCell(f"no served cell class {cls_name!r}")
        if method.startswith("_"):
            raise UnknownCell(f"{cls_name} has no public method {method!r}")

    def healthz(self, request: Request) -> Response:
        node = self.node
        status = node.status
        body = {"status": status, "node": node.node_id, "generation": node.generation}
        if status == SERVING:
            return JSONResponse(body)
        return JSONResponse(
            body, status_code=503, headers={"Retry-After": str(self.settings.retry_after_seconds)}
        )


async def _http_error(request: Request, exc: Exception) -> Response:
    """Router errors (no such route, wrong method) as JSON like every other answer."""
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    code = {404: "not_found", 405: "method_not_allowed"}.get(status, "http_error")
    detail = exc.detail if isinstance(exc, HTTPException) else "internal error"
    return JSONResponse(
        {"error": code, "message": detail, "retryable": False},
        status_code=status,
        headers=getattr(exc, "headers", None),
    )


_EXCEPTION_HANDLERS: dict[Any, Callable[..., Any]] = {404: _http_error, 405: _http_error}


class _PublicCore(_Core):
    """Public calls: run here, or forward once to the owner (and once more on stale route)."""

    def __init__(self, node: NodeLike, fleet_key: bytes, settings: ServerSettings) -> None:
        super().__init__(node, fleet_key, settings)
        self._client: httpx.AsyncClient | None = None

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
            self.check_target(cls_name, method)
            body, kwargs = await self.read_kwargs(request, encoding)
            return await self.route(cls_name, name, method, kwargs, body, encoding)
        except (CallError, InvalidCellId) as e:
            return self.error(_as_call_error(e), encoding)

    async def route(
        self,
        cls_name: str,
        name: str,
        method: str,
        kwargs: dict[str, Any],
        body: bytes,
        encoding: codec.Encoding,
    ) -> Response:
        """Run locally or forward; after a stale-route answer, forget and route once more."""
        for attempt in (1, 2):
            try:
                result = await self.run(self._call, cls_name, name, method, kwargs)
            except RemoteOwner as owner:
                answer = await self.forward(owner, cls_name, name, method, body, encoding)
                if attempt == 1 and _should_reroute(answer):
                    # Stale, draining or unreachable owner: the call ran nowhere, so forget the
                    # cached route and decide again from the bucket (the cell may be free now).
                    log.info("stale route to %s for %s:%s; refreshing", owner.node, cls_name, name)
                    await self.run(self.node.forget_route, cls_name, name)
                    continue
                return answer
            except Exception as e:  # every failure becomes an answer
                err = _as_call_error(e)
                if isinstance(err, InternalError):
                    log.exception("call %s:%s.%s failed unexpectedly", cls_name, name, method)
                return self.error(err, encoding)
            return self.ok(result, encoding)
        raise AssertionError("unreachable")  # pragma: no cover

    def _call(self, cls_name: str, name: str, method: str, kwargs: dict[str, Any]) -> Any:
        return self.node.call(
            cls_name, name, method, kwargs, forwarded=False, timeout=self.settings.call_timeout
        )

    async def forward(
        self,
        owner: RemoteOwner,
        cls_name: str,
        name: str,
        method: str,
        body: bytes,
        encoding: codec.Encoding,
    ) -> Response:
        """Send the call, signed, to the owner's internal listener; pass its answer through."""
        path = INTERNAL_CELL_ROUTE.format(cls_name=cls_name, name=name, method=method)
        url = (
            _base_url(owner.addr)
            + "/internal/cells/"
            + "/".join(quote(part, safe="") for part in (cls_name, name, method))
        )
        headers = signing.sign_request(
            self.key, "POST", path, body, source=self.node.node_id, target=owner.node
        )
        headers["Content-Type"] = codec.CONTENT_TYPES[encoding]
        try:
            peer = await self.client().post(url, content=body, headers=headers)
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as e:
            # Nothing was sent: the call did not run anywhere, another try is safe.
            return self.error(
                NodeUnavailable(f"owner {owner.node} at {owner.addr} is unreachable: {e!r}"),
                encoding,
            )
        except httpx.HTTPError as e:
            # Sent, but no answer: the call may have run on the owner.
            return self.error(
                NotDurable(f"forwarded call to {owner.node} has an unknown outcome: {e!r}"),
                encoding,
            )
        if peer.status_code == 401:
            log.error("peer %s refused our signature: %s", owner.node, peer.text[:200])
            return self.error(
                PeerRefused(f"owner {owner.node} refused this node's signed forward"), encoding
            )
        headers_out = {
            k: v
            for k, v in peer.headers.items()
            if k.lower() in ("retry-after", NODE_HEADER.lower())
        }
        return Response(
            peer.content,
            status_code=peer.status_code,
            headers=headers_out,
            media_type=peer.headers.get("content-type", codec.CONTENT_TYPES[encoding]),
        )


def _base_url(addr: str) -> str:
    addr = addr.rstrip("/")
    return addr if "://" in addr else f"http://{addr}"


def _should_reroute(resp: Response) -> bool:
    """The forward did not run the call and a fresh route may differ."""
    if resp.status_code not in (StaleRoute.status, NodeUnavailable.status):
        return False
    try:
        payload = codec.decode(
            bytes(resp.body), codec.encoding_for(resp.headers.get("content-type"))
        )
    except CallError:
        return False
    return isinstance(payload, dict) and payload.get("error") in (
        StaleRoute.code,
        NodeUnavailable.code,
    )


class _InternalCore(_Core):
    """Signed forwarded calls from peers, and the operator endpoints."""

    def __init__(self, node: NodeLike, fleet_key: bytes, settings: ServerSettings) -> None:
        super().__init__(node, fleet_key, settings)
        self.nonces = signing.NonceCache(settings.signature_window, settings.nonce_cache_size)

    async def handle_call(self, request: Request) -> Response:
        cls_name = request.path_params["cls_name"]
        name = request.path_params["name"]
        method = request.path_params["method"]
        encoding = codec.encoding_for(request.headers.get("content-type"))
        try:
            body = await codec.read_body(
                request.stream(),
                request.headers.get("content-length"),
                self.settings.max_body_bytes,
            )
            source = signing.verify_request(
                self.key,
                request.method,
                request.scope["path"],
                body,
                request.headers,
                expected_target=self.node.node_id,
                nonces=self.nonces,
                window=self.settings.signature_window,
            )
            self.check_target(cls_name, method)
            kwargs = codec.decode_kwargs(body, encoding)
            result = await self.run(self._call, cls_name, name, method, kwargs)
        except RemoteOwner as e:
            # Runtime contract says this cannot happen for forwarded calls; never multi-hop.
            return self.error(StaleRoute(f"not the owner of {cls_name}:{name} ({e})"), encoding)
        except Exception as e:
            err = _as_call_error(e)
            if isinstance(err, signing.Unauthorized):
                log.warning("refused peer call %s: %s", request.url.path, err)
            elif isinstance(err, InternalError):
                log.exception("forwarded call %s failed unexpectedly", request.url.path)
            return self.error(err, encoding)
        log.debug("forwarded call from %s: %s:%s.%s", source, cls_name, name, method)
        return self.ok(result, encoding)

    def _call(self, cls_name: str, name: str, method: str, kwargs: dict[str, Any]) -> Any:
        return self.node.call(
            cls_name, name, method, kwargs, forwarded=True, timeout=self.settings.call_timeout
        )

    async def state(self, request: Request) -> Response:
        state = await anyio.to_thread.run_sync(self.node.state)
        return JSONResponse(state, headers={NODE_HEADER: self.node.node_id})

    async def metrics(self, request: Request) -> Response:
        text = await anyio.to_thread.run_sync(self.node.metrics_text)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4; charset=utf-8")


def build_public_app(
    node: NodeLike, fleet_key: bytes, settings: ServerSettings | None = None
) -> Starlette:
    """The client-facing app: cell calls (run here or forwarded) and a health check."""
    core = _PublicCore(node, fleet_key, settings or ServerSettings())

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await core.aclose()

    routes = [
        Route(CELL_ROUTE, core.handle_call, methods=["POST"]),
        Route("/healthz", core.healthz, methods=["GET"]),
    ]
    app = Starlette(routes=routes, exception_handlers=_EXCEPTION_HANDLERS, lifespan=lifespan)
    app.state.core = core
    return app


def build_internal_app(
    node: NodeLike, fleet_key: bytes, settings: ServerSettings | None = None
) -> Starlette:
    """The peer/operator app: signed forwarded calls, state, metrics, health check."""
    core = _InternalCore(node, fleet_key, settings or ServerSettings())
    routes = [
        Route(INTERNAL_CELL_ROUTE, core.handle_call, methods=["POST"]),
        Route("/state", core.state, methods=["GET"]),
        Route("/metrics", core.metrics, methods=["GET"]),
        Route("/healthz", core.healthz, methods=["GET"]),
    ]
    app = Starlette(routes=routes, exception_handlers=_EXCEPTION_HANDLERS)
    app.state.core = core
    return app
