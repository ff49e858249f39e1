"""What both of a node's HTTP apps share: the node as they see it (:class:`NodeLike`),
their settings, error answers that always say whether the call ran, the hand-off of a call
to a worker thread (or to the cell, without one, for a quick read), and the outermost guard
that answers even when a request dies in an unexpected way.

Calls into the node block (the answer waits for durability), so they run in worker threads
under a capacity limiter: a slow cell never blocks the event loop or health checks.

Every error answer says whether the call ran (``outcome``: ``not_run``, ``unknown`` or
``failed``, see :mod:`cellactors.errors`), and is a JSON (or msgpack) body even when the
request dies in an unexpected way: an outermost guard turns bugs into ``internal``
(``unknown``) and a request cancelled by the server's shutdown into ``not_durable`` (or
``node_unavailable`` if it had not reached the node yet).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import anyio
import anyio.to_thread
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

import cellactors.errors as errors
from cellactors.actors.sockets import SOCKET_METHOD
from cellactors.core import keys
from cellactors.core.principal import Principal
from cellactors.errors import (
    NOT_RUN,
    BadRequest,
    CallError,
    InternalError,
    InvalidCellId,
    NodeUnavailable,
    NotDurable,
    UnknownCell,
    UnknownMethod,
)
from cellactors.server import signing
from cellactors.server.auth.authentication import Authentication
from cellactors.server.loop_reply import LoopReply
from cellactors.server.openapi import build_openapi
from cellactors.server.peer_keys import KeySource, PeerKeys, key_source
from cellactors.wire import codec

if TYPE_CHECKING:
    from cellactors.actors.node import Submitted

log = logging.getLogger("cellactors.server")

T = TypeVar("T")

NODE_HEADER = "X-Cellactors-Node"
CELL_ROUTE = "/cells/{cls_name}/{name}/{method}"
CHANGES_ROUTE = "/cells/{cls_name}/{name}/changes"
NDJSON_TYPE = "application/x-ndjson"
DEAD_LETTERS_ROUTE = "/cells/{cls_name}/{name}/dead-letters"
SERVING = "serving"
#: How often a request waiting on a cell's reply checks that the cell is still there.
PENDING_CHECK_S = 0.25
#: Bodies up to this size are decoded on the serving loop; larger ones in a worker thread.
DECODE_ON_LOOP_BYTES = 64 << 10
_PROGRESS = "cellactors.progress"  # scope key of the request's Progress


class NodeLike(Protocol):
    """What the HTTP layer needs from the runtime (``cellactors.actors.node.Node``)."""

    node_id: str
    generation: str
    classes: dict[str, type]

    @property
    def status(self) -> str: ...

    def call(
        self,
        cls_name: str,
        name: str,
        method: str,
        kwargs: dict[str, Any],
        *,
        forwarded: bool = False,
        timeout: float = 30.0,
        key: str | None = None,
        result_check: Callable[[Any], None] | None = None,
        chain: tuple[str, ...] = (),
        caller: Principal | None = None,
    ) -> Any: ...

    def submit_here(
        self,
        cls_name: str,
        name: str,
        method: str,
        kwargs: dict[str, Any],
        *,
        reply: LoopReply,
        timeout: float | None = None,
        key: str | None = None,
        result_check: Callable[[Any], None] | None = None,
        caller: Principal | None = None,
    ) -> Submitted | None: ...

    def still_pending(self, sub: Submitted) -> bool: ...

    def answer(self, sub: Submitted) -> Any: ...

    def may_answer(self) -> bool: ...

    def store_time(self) -> float:
        """The store's time in epoch seconds (signed forwards are stamped and checked with
        it, so nodes whose wall clocks disagree still accept each other's)."""
        ...

    def state(self) -> dict[str, Any]: ...

    def metrics_text(self) -> str: ...

    def fleet(self) -> dict[str, Any]: ...

    def drain(self) -> None: ...

    def forget_route(self, cls_name: str, name: str) -> None: ...

    def feed_reader(self, cell_id: str) -> Any: ...

    def feed_stream_refused(self) -> None:
        """Count a follow stream refused at ``max_feed_streams`` (a metric)."""
        ...

    def dead_letters(self, cls: str, name: str) -> list[Any]: ...

    def retry_dead_letters(
        self, cls: str, name: str, ids: Iterable[str] | None = None
    ) -> list[str]: ...

    def purge_dead_letters(
        self, cls: str, name: str, ids: Iterable[str] | None = None
    ) -> list[str]: ...


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
    #: Limits on the wire, per listener (cellactors.server.wire_limits, docs/http-api.md).
    max_header_bytes: int = 32 << 10  # request line and headers; over it: 431
    max_header_count: int = 100  # headers per request; over it: 431
    header_timeout: float = 10.0  # a request head, from its first byte; then 408
    body_timeout: float = 60.0  # a request body, from the end of its head; then 408
    #: A connection idle (new, or between requests) this long is closed: above the 60 s
    #: a load balancer or proxy keeps an idle upstream connection, so it closes first.
    keep_alive_timeout: float = 75.0
    max_connections: int = 1024  # open connections per listener; beyond: 503 and close
    max_sockets: int = 10_000  # WebSockets and event streams held (not in max_connections)
    max_socket_buffer: int = 1 << 20  # unsent bytes per socket; beyond: closed with 4408
    max_socket_frame: int = 1 << 20  # bytes of one frame a client sends; beyond: 1009
    socket_watch_interval: float = 2.0  # how often a holder checks its cells' owners live
    socket_resume_grace: float = 30.0  # a dropped socket (no close) may be resumed this long
    graceful_timeout: float = 60.0  # after drain, how long in-flight requests may take
    fence_grace_seconds: float = 2.0  # after a self-fence; the process exits within 5 s of it
    fence_poll_interval: float = 0.5  # runner checks node.status this often
    fleet_cache_seconds: float = 1.0  # /fleet reads the bucket at most this often
    feed_max_wait: float = 60.0  # longest ``wait`` a changes request may ask for
    feed_poll_interval: float = 0.25  # bucket reads while following (docs/feed.md: cost)
    feed_page: int = 500  # transactions read per bucket round
    max_concurrent_feeds: int = 64  # worker threads reading feeds at once, per app
    max_feed_streams: int = 1000  # open follow streams (``wait`` > 0) at once, per node
    #: Event streams (``Accept: text/event-stream``, cellactors.server.feed_events): a
    #: comment after this many idle seconds, the ``retry:`` EventSource waits before it
    #: reconnects, and how long a write may wait for a client that reads nothing.
    feed_heartbeat: float = 15.0
    feed_retry: float = 1.0
    feed_stall_timeout: float = 30.0
    #: Names (or ``fnmatch`` patterns, e.g. ``*.peers.ns.svc``) the internal listener answers
    #: to in ``Host``, besides loopback names and the address it listens on.
    internal_hosts: tuple[str, ...] = ()
    #: Who is calling the public listener (no scheme: open, every caller admitted).
    authentication: Authentication = field(default_factory=Authentication)
    #: An open public listener on an address other than loopback, on purpose.
    allow_anonymous: bool = False
    #: Origins whose pages may call the public listener from a browser (CORS); none: off.
    cors_origins: tuple[str, ...] = ()
    #: Debug mode (``serve --debug``): a failed method's answer carries its ``traceback``.
    debug: bool = False


def error_response(
    err: CallError,
    encoding: codec.Encoding,
    node_id: str,
    retry_after: int = 1,
    *,
    close: bool = False,
) -> Response:
    """A machine-readable error answer; 503s carry Retry-After."""
    headers = {NODE_HEADER: node_id}
    if err.status == 503:
        headers["Retry-After"] = str(retry_after)
    if close or (isinstance(err, errors.PayloadTooLarge) and not err.drained):
        headers["Connection"] = "close"
    return Response(
        codec.encode_error(err, encoding),
        status_code=err.status,
        media_type=codec.CONTENT_TYPES[encoding],
        headers=headers,
    )


def as_call_error(exc: BaseException) -> CallError:
    """Map what node.call may raise onto the wire error. An unexpected failure is logged
    here, with its traceback, under a reference the answer gives: its message (a path, a
    query, a token) stays in the node's log, never with a caller."""
    if isinstance(exc, CallError):
        return exc
    if isinstance(exc, InvalidCellId):
        return BadRequest(str(exc))
    return internal_error(exc)


def internal_error(exc: BaseException) -> InternalError:
    """The answer to a failure no caller caused: logged in full under a reference, which
    is all the answer carries."""
    reference = secrets.token_hex(6)
    log.error("unexpected failure %s: %s: %s", reference, type(exc).__name__, exc, exc_info=exc)
    return InternalError(
        f"an unexpected failure inside the node (reference {reference} in its log)"
    )


class Progress:
    """How far one request got: once ``handed_over`` is set, the call may run (or have run)
    on some node, so losing its answer makes its outcome unknown."""

    handed_over = False


def hand_over(request: Request) -> None:
    """Mark the request as handed to a node (set before, never after, the hand-over)."""
    progress = request.scope.get(_PROGRESS)
    if isinstance(progress, Progress):
        progress.handed_over = True


class Core:
    """State shared by the handlers of one app: node, key, settings, limiter."""

    def __init__(
        self, node: NodeLike, fleet_key: bytes | PeerKeys | KeySource, settings: ServerSettings
    ) -> None:
        self.keys = key_source(fleet_key)
        self.node = node
        self.settings = settings
        self.limiter = anyio.CapacityLimiter(settings.max_concurrent_calls)
        self._openapi: bytes | None = None  # the document, built at its first request
        self.socket_hub: Any = None  # the sockets this app holds (socket_routes), if any

    @property
    def key(self) -> bytes:
        """The key this node signs peer requests with now."""
        return self.keys().signing

    async def run(self, func: Callable[..., T], *args: Any) -> T:
        """Run a blocking node method in a worker thread under the call limiter."""
        return await anyio.to_thread.run_sync(func, *args, limiter=self.limiter)

    async def run_call(
        self,
        cls_name: str,
        name: str,
        method: str,
        kwargs: dict[str, Any],
        key: str | None,
        check: codec.ResultCheck,
        blocking: Callable[[], Any],
        caller: Principal | None = None,
    ) -> Any:
        """A call: straight into the cell's mailbox when the cell is active on this node
        (or run right here, for a read-only method of an idle cell), this task resuming when
        the cell sets the (durable) answer, with no worker thread in between; otherwise
        ``blocking`` in a worker thread (activation, routing, a wake), also when the cell
        stopped before it took the call (it ran nowhere)."""
        # A free slot is taken without yielding to the loop (``async with`` would yield
        # twice, which is a tenth of a warm read's time on one connection).
        try:
            self.limiter.acquire_nowait()
        except anyio.WouldBlock:
            await self.limiter.acquire()
        try:
            reply = LoopReply(asyncio.get_running_loop())
            sub = self.node.submit_here(
                cls_name,
                name,
                method,
                kwargs,
                reply=reply,
                timeout=self.settings.call_timeout,
                key=key,
                result_check=check,
                caller=caller,
            )
            while sub is not None:
                if await reply.wait(PENDING_CHECK_S):
                    return self.node.answer(sub)
                if not self.node.still_pending(sub):
                    break
        finally:
            self.limiter.release()
        return await self.run(blocking)

    def error(self, err: CallError, encoding: codec.Encoding, *, close: bool = False) -> Response:
        if isinstance(err, errors.MethodFailed) and not self.settings.debug:
            err = errors.MethodFailed(err.exc_type, err.exc_message)  # no traceback leaves
        return error_response(
            err, encoding, self.node.node_id, self.settings.retry_after_seconds, close=close
        )

    def ok(self, result: Any, encoding: codec.Encoding, check: codec.ResultCheck) -> Response:
        """The success answer, unless the node may no longer answer (fenced, stopped, lease
        deadline passed while the answer was held): then the outcome is unknown."""
        try:
            body = check.body_for(result)
        except codec.ENCODE_ERRORS as e:
            # The result check refuses these before commit; a result that still cannot be
            # encoded (e.g. a recorded result replayed in another encoding) has run.
            log.error("result of a call is not encodable as %s: %s", encoding, e)
            return self.error(
                InternalError(f"the call ran but its result is not encodable as {encoding}: {e}"),
                encoding,
            )
        if not self.node.may_answer():
            log.warning("node %s may no longer answer; a held result is dropped", self.node.node_id)
            return self.error(
                NotDurable(
                    f"node {self.node.node_id} fenced or stopped while the answer was held; "
                    "the call may or may not have taken effect"
                ),
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
        if len(body) <= DECODE_ON_LOOP_BYTES:
            return body, codec.decode_kwargs(body, encoding)
        # A large body takes milliseconds and megabytes to decode: off the serving loop, so
        # health checks and other calls never wait behind it.
        return body, await anyio.to_thread.run_sync(codec.decode_kwargs, body, encoding)

    def check_target(self, cls_name: str, name: str, method: str, peer: bool = False) -> None:
        """Refuse unknown classes, private methods and bad cell ids before touching a
        thread (a ``peer``'s signed forward may carry a socket event)."""
        if cls_name not in self.node.classes:
            raise UnknownCell(f"no served cell class {cls_name!r}")
        if method.startswith("_") and not (peer and method == SOCKET_METHOD):
            raise UnknownMethod(f"{cls_name} has no public method {method!r}")
        keys.make_cell_id(cls_name, name)

    def openapi(self, request: Request) -> Response:
        """The OpenAPI document of the served classes (public: it holds no secret). Built
        once: it takes milliseconds per method, on the serving loop, for anyone who asks."""
        if self._openapi is None:
            auth = self.settings.authentication
            doc = build_openapi(dict(self.node.classes), authenticated=not auth.open)
            self._openapi = json.dumps(doc, separators=(",", ":")).encode()
        return Response(self._openapi, media_type="application/json")

    def healthz(self, request: Request) -> Response:
        node = self.node
        status = node.status
        body = {"status": status, "node": node.node_id, "generation": node.generation}
        if status == SERVING:
            return JSONResponse(body)
        return JSONResponse(
            body, status_code=503, headers={"Retry-After": str(self.settings.retry_after_seconds)}
        )


class AnswerGuard:
    """Outermost handler of every request (pure ASGI): whatever happens, an answer that has
    not started yet is a machine-readable error with its outcome class.

    - A bug anywhere below: 500 ``internal`` (``unknown``), logged once with its traceback,
      instead of Starlette's plain-text 500.
    - The request cancelled (uvicorn cancels requests still running when the graceful
      shutdown period ends, e.g. after a self-fence): 503 ``not_durable`` if the call was
      handed to a node, else 503 ``node_unavailable``; the connection is closed.
    - The client went away while sending its body: one log line, no traceback (nothing ran,
      and nobody is left to answer).
    """

    def __init__(self, app: ASGIApp, core: Core) -> None:
        self.app = app
        self.core = core

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        progress = Progress()
        scope[_PROGRESS] = progress
        started = False

        async def tracked_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracked_send)
        except ClientDisconnect:
            log.info("client disconnected before sending its whole body: %s", scope.get("path"))
        except asyncio.CancelledError:
            if started:
                raise
            err: CallError = (
                NotDurable("the node stopped while the call was in progress; outcome unknown")
                if progress.handed_over
                else NodeUnavailable("the node stopped before the call was handed over")
            )
            log.warning("answering %s to a request cut short: %s", err.code, scope.get("path"))
            # The task is ending anyway; answer instead of letting uvicorn send a plain 500.
            await self._answer(err, scope, send)
        except Exception as e:
            if started:
                log.exception("unexpected failure serving %s", scope.get("path"))
                raise
            await self._answer(internal_error(e), scope, send)

    async def _answer(self, err: CallError, scope: Scope, send: Send) -> None:
        encoding = codec.encoding_for(Headers(scope=scope).get("content-type"))
        response = self.core.error(err, encoding, close=True)
        with contextlib.suppress(OSError, RuntimeError):  # the connection may be gone too
            await response(scope, _no_receive, send)


async def _no_receive() -> Message:
    return {"type": "http.disconnect"}


async def _http_error(request: Request, exc: Exception) -> Response:
    """Router errors (no such route, wrong method) as JSON like every other answer."""
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    code = {404: "not_found", 405: "method_not_allowed"}.get(status, "http_error")
    detail = exc.detail if isinstance(exc, HTTPException) else "internal error"
    return JSONResponse(
        {"error": code, "message": detail, "outcome": NOT_RUN, "retryable": False},
        status_code=status,
        headers=getattr(exc, "headers", None),
    )


EXCEPTION_HANDLERS: dict[Any, Callable[..., Any]] = {404: _http_error, 405: _http_error}
