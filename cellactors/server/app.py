"""The node's two HTTP apps.

*Public* (``POST /cells/{cls}/{name}/{method}``, ``GET /cells/{cls}/{name}/changes``,
``GET /healthz``) takes calls from clients and forwards them, signed, to the owning node when
the runtime says another live node owns the cell; any node serves a cell's change feed from
the bucket. *Internal* (``POST /internal/cells/...``, ``GET /state``, ``GET /metrics``,
``GET /fleet``, ``GET /healthz``, the fleet page at ``GET /``, and a cell's dead letters at
``/cells/{cls}/{name}/dead-letters``) takes signed forwarded calls from peers plus operator
endpoints (those of dead letters signed too: they show and change message arguments); it
must listen on a private address. The public
app has no internal route at all.

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
import functools
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import anyio
import anyio.to_thread
import httpx
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

import cellactors.errors as errors
from cellactors.core import keys
from cellactors.core.routing import reroutable, reroutable_error
from cellactors.errors import (
    NOT_RUN,
    BadRequest,
    BucketError,
    CallError,
    DeadLetterNotFound,
    FeedHistoryMissing,
    FeedUnavailable,
    InternalError,
    InvalidCellId,
    NodeUnavailable,
    NotDurable,
    RemoteOwner,
    StaleRoute,
    UnknownCell,
    UnknownMethod,
)
from cellactors.server import codec, fleet_page, forward, signing
from cellactors.server.forward import CHAIN_HEADER, INTERNAL_CELL_ROUTE, decode_chain
from cellactors.server.loop_reply import LoopReply
from cellactors.server.unsent import NOT_SENT

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
_PROGRESS = "cellactors.progress"  # scope key of the request's _Progress


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
    keep_alive_timeout: float = 75.0  # server side; longer than typical client pool expiry
    graceful_timeout: float = 60.0  # after drain, how long in-flight requests may take
    fence_grace_seconds: float = 2.0  # after a self-fence; the process exits within 5 s of it
    fence_poll_interval: float = 0.5  # runner checks node.status this often
    fleet_cache_seconds: float = 1.0  # /fleet reads the bucket at most this often
    feed_max_wait: float = 60.0  # longest ``wait`` a changes request may ask for
    feed_poll_interval: float = 0.25  # bucket reads while following (docs/feed.md: cost)
    feed_page: int = 500  # transactions read per bucket round
    max_concurrent_feeds: int = 64  # worker threads reading feeds at once, per app


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


def _as_call_error(exc: BaseException) -> CallError:
    """Map what node.call may raise onto the wire error."""
    if isinstance(exc, CallError):
        return exc
    if isinstance(exc, InvalidCellId):
        return BadRequest(str(exc))
    return InternalError(f"{type(exc).__name__}: {exc}")


class _Progress:
    """How far one request got: once ``handed_over`` is set, the call may run (or have run)
    on some node, so losing its answer makes its outcome unknown."""

    handed_over = False


def _hand_over(request: Request) -> None:
    """Mark the request as handed to a node (set before, never after, the hand-over)."""
    progress = request.scope.get(_PROGRESS)
    if isinstance(progress, _Progress):
        progress.handed_over = True


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

    async def run_call(
        self,
        cls_name: str,
        name: str,
        method: str,
        kwargs: dict[str, Any],
        key: str | None,
        check: codec.ResultCheck,
        blocking: Callable[[], Any],
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
        return body, codec.decode_kwargs(body, encoding)

    def check_target(self, cls_name: str, name: str, method: str) -> None:
        """Refuse unknown classes, private methods and bad cell ids before touching a
        thread."""
        if cls_name not in self.node.classes:
            raise UnknownCell(f"no served cell class {cls_name!r}")
        if method.startswith("_"):
            raise UnknownMethod(f"{cls_name} has no public method {method!r}")
        keys.make_cell_id(cls_name, name)

    def healthz(self, request: Request) -> Response:
        node = self.node
        status = node.status
        body = {"status": status, "node": node.node_id, "generation": node.generation}
        if status == SERVING:
            return JSONResponse(body)
        return JSONResponse(
            body, status_code=503, headers={"Retry-After": str(self.settings.retry_after_seconds)}
        )


class _AnswerGuard:
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

    def __init__(self, app: ASGIApp, core: _Core) -> None:
        self.app = app
        self.core = core

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        progress = _Progress()
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
            log.exception("unexpected failure serving %s", scope.get("path"))
            if started:
                raise
            await self._answer(InternalError(f"{type(e).__name__}: {e}"), scope, send)

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


_EXCEPTION_HANDLERS: dict[Any, Callable[..., Any]] = {404: _http_error, 405: _http_error}


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


class _PublicCore(_Core):
    """Public calls: run here, or forward once to the owner (and once more on stale route)."""

    def __init__(self, node: NodeLike, fleet_key: bytes, settings: ServerSettings) -> None:
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
            return self.error(_as_call_error(e), encoding)
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
            key = codec.idempotency_key(request.headers.getlist(codec.IDEMPOTENCY_HEADER))
            self.check_target(cls_name, name, method)
            body, kwargs = await self.read_kwargs(request, encoding)
            call = _Call(cls_name, name, method, kwargs, body, encoding, key)
            return await self.route(request, call)
        except (CallError, InvalidCellId) as e:
            return self.error(_as_call_error(e), encoding)

    async def route(self, request: Request, call: _Call) -> Response:
        """Run locally or forward. Only an answer proving that the call ran nowhere
        (``not_run``: stale route, unavailable or unreachable owner, owner restarted) makes
        this node forget its route and decide once more; never a third hop."""
        check = codec.ResultCheck(call.encoding)
        for attempt in (1, 2):
            _hand_over(request)
            try:
                result = await self.run_call(
                    call.cls_name,
                    call.name,
                    call.method,
                    call.kwargs,
                    call.key,
                    check,
                    functools.partial(self._call, call, check),
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
                err = _as_call_error(e)
                if isinstance(err, InternalError):
                    log.exception(
                        "call %s:%s.%s failed unexpectedly", call.cls_name, call.name, call.method
                    )
                return self.error(err, call.encoding)
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


class _InternalCore(_Core):
    """Signed forwarded calls from peers, and the operator endpoints."""

    def __init__(self, node: NodeLike, fleet_key: bytes, settings: ServerSettings) -> None:
        super().__init__(node, fleet_key, settings)
        self.nonces = signing.NonceCache(settings.signature_window, settings.nonce_cache_size)
        self._fleet: tuple[float, dict[str, Any]] | None = None  # (monotonic time, answer)
        self._fleet_lock = anyio.Lock()

    async def handle_call(self, request: Request) -> Response:
        cls_name = request.path_params["cls_name"]
        name = request.path_params["name"]
        method = request.path_params["method"]
        encoding = codec.encoding_for(request.headers.get("content-type"))
        check = codec.ResultCheck(encoding)
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
                expected_generation=self.node.generation,
                nonces=self.nonces,
                now=self.node.store_time(),
                window=self.settings.signature_window,
            )
            key = codec.idempotency_key(request.headers.getlist(codec.IDEMPOTENCY_HEADER))
            self.check_target(cls_name, name, method)
            kwargs = codec.decode_kwargs(body, encoding)
            chain = decode_chain(request.headers.get(CHAIN_HEADER))  # a call between cells
            _hand_over(request)
            blocking = functools.partial(
                self._call, cls_name, name, method, kwargs, key, check, chain
            )
            if chain:  # a call between cells: its cycle check is the blocking path's
                result = await self.run(blocking)
            else:
                result = await self.run_call(cls_name, name, method, kwargs, key, check, blocking)
        except ClientDisconnect:
            raise  # the answer guard logs it; nobody is left to answer
        except RemoteOwner as e:
            # Runtime contract says this cannot happen for forwarded calls; never multi-hop.
            return self.error(StaleRoute(f"not the owner of {cls_name}:{name} ({e})"), encoding)
        except Exception as e:
            err = _as_call_error(e)
            if isinstance(err, errors.Unauthorized):
                log.warning("refused peer call %s: %s", request.url.path, err)
            elif isinstance(err, InternalError):
                log.exception("forwarded call %s failed unexpectedly", request.url.path)
            return self.error(err, encoding)
        log.debug("forwarded call from %s: %s:%s.%s", source, cls_name, name, method)
        return self.ok(result, encoding, check)

    def _call(
        self,
        cls_name: str,
        name: str,
        method: str,
        kwargs: dict[str, Any],
        key: str | None,
        check: codec.ResultCheck,
        chain: tuple[str, ...] = (),
    ) -> Any:
        return self.node.call(
            cls_name,
            name,
            method,
            kwargs,
            forwarded=True,
            timeout=self.settings.call_timeout,
            key=key,
            result_check=check,
            **({"chain": chain} if chain else {}),  # only calls between cells carry one
        )

    # --- dead letters (operator endpoints, signed with the fleet key) ---------------------

    async def list_dead_letters(self, request: Request) -> Response:
        """``GET /cells/{cls}/{name}/dead-letters``: the cell's dead letters, oldest first."""
        return await self._dead_letters(
            request,
            lambda cls, name, _ids: [x.to_dict() for x in self.node.dead_letters(cls, name)],
        )

    async def retry_dead_letters(self, request: Request) -> Response:
        """``POST .../dead-letters/retry`` (all) or ``POST .../dead-letters/{letter}/retry``:
        move dead letters back into the outbox; answers the ids moved."""
        return await self._dead_letters(request, self.node.retry_dead_letters, "retried")

    async def purge_dead_letters(self, request: Request) -> Response:
        """``DELETE .../dead-letters`` (all) or ``DELETE .../dead-letters/{letter}``: delete
        dead letters for good; answers the ids deleted."""
        return await self._dead_letters(request, self.node.purge_dead_letters, "purged")

    async def _dead_letters(
        self,
        request: Request,
        act: Callable[[str, str, list[str] | None], list[Any]],
        done: str = "dead_letters",
    ) -> Response:
        """Verify the operator's signature, run ``act`` on the cell in a worker thread (it
        may activate the cell here) and answer ``{done: [...]}``. A cell a live peer owns is
        409 ``remote_owner`` with that node's internal address; a named letter that is not
        there is 404 ``dead_letter_not_found``."""
        cls_name = request.path_params["cls_name"]
        name = request.path_params["name"]
        letter = request.path_params.get("letter")
        try:
            body = await codec.read_body(request.stream(), request.headers.get("content-length"), 0)
            signing.verify_request(
                self.key,
                request.method,
                request.scope["path"],
                body,
                request.headers,
                expected_target=self.node.node_id,
                expected_generation=self.node.generation,
                nonces=self.nonces,
                window=self.settings.signature_window,
            )
            if cls_name not in self.node.classes:
                raise UnknownCell(f"no served cell class {cls_name!r}")
            keys.make_cell_id(cls_name, name)
            ids = None if letter is None else [letter]
            result = await self.run(act, cls_name, name, ids)
        except RemoteOwner as owner:
            answer = {
                "error": owner.code,
                "message": str(owner),
                "outcome": NOT_RUN,
                "retryable": False,
                "node": owner.node,
                "addr": owner.addr,
            }
            return JSONResponse(answer, status_code=409, headers={NODE_HEADER: self.node.node_id})
        except Exception as e:
            err = _as_call_error(e)
            if isinstance(err, errors.Unauthorized):
                log.warning("refused operator request %s: %s", request.url.path, err)
            elif isinstance(err, InternalError):
                log.exception("operator request %s failed unexpectedly", request.url.path)
            return self.error(err, "json")
        if letter is not None and not result:
            return self.error(
                DeadLetterNotFound(f"{cls_name}:{name} has no dead letter {letter!r}"), "json"
            )
        return Response(
            codec.encode({done: result}, "json"),
            media_type=codec.CONTENT_TYPES["json"],
            headers={NODE_HEADER: self.node.node_id},
        )

    async def state(self, request: Request) -> Response:
        state = await anyio.to_thread.run_sync(self.node.state)
        return JSONResponse(state, headers={NODE_HEADER: self.node.node_id})

    async def metrics(self, request: Request) -> Response:
        text = await anyio.to_thread.run_sync(self.node.metrics_text)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    async def fleet(self, request: Request) -> Response:
        """Every node lease in the bucket (``Node.fleet``), read at most once per
        ``fleet_cache_seconds`` however many pages poll; 503 when the bucket fails."""
        headers = {NODE_HEADER: self.node.node_id, "Cache-Control": "no-store"}
        async with self._fleet_lock:
            cached = self._fleet
            if cached is None or time.monotonic() - cached[0] >= self.settings.fleet_cache_seconds:
                try:
                    answer = await anyio.to_thread.run_sync(self.node.fleet)
                except BucketError as e:
                    self._fleet = None
                    body = {
                        "error": "bucket_unavailable",
                        "message": f"could not read the node leases: {e}",
                        "outcome": NOT_RUN,
                        "retryable": True,
                    }
                    return JSONResponse(body, status_code=503, headers=headers)
                cached = self._fleet = (time.monotonic(), answer)
        return JSONResponse(cached[1], headers=headers)


def build_public_app(
    node: NodeLike, fleet_key: bytes, settings: ServerSettings | None = None
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
        Route(CHANGES_ROUTE, core.handle_changes, methods=["GET"]),
        Route(CELL_ROUTE, core.handle_call, methods=["POST"]),
        Route("/healthz", core.healthz, methods=["GET"]),
    ]
    app = Starlette(
        routes=routes,
        middleware=[Middleware(_AnswerGuard, core=core)],
        exception_handlers=_EXCEPTION_HANDLERS,
        lifespan=lifespan,
    )
    app.state.core = core
    return app


def build_internal_app(
    node: NodeLike, fleet_key: bytes, settings: ServerSettings | None = None
) -> Starlette:
    """The peer/operator app: signed forwarded calls, state, metrics, fleet, health check,
    and the fleet page."""
    core = _InternalCore(node, fleet_key, settings or ServerSettings())
    routes = [
        Route(INTERNAL_CELL_ROUTE, core.handle_call, methods=["POST"]),
        Route(DEAD_LETTERS_ROUTE, core.list_dead_letters, methods=["GET"]),
        Route(DEAD_LETTERS_ROUTE, core.purge_dead_letters, methods=["DELETE"]),
        Route(DEAD_LETTERS_ROUTE + "/retry", core.retry_dead_letters, methods=["POST"]),
        Route(DEAD_LETTERS_ROUTE + "/{letter}", core.purge_dead_letters, methods=["DELETE"]),
        Route(DEAD_LETTERS_ROUTE + "/{letter}/retry", core.retry_dead_letters, methods=["POST"]),
        Route("/state", core.state, methods=["GET"]),
        Route("/metrics", core.metrics, methods=["GET"]),
        Route("/fleet", core.fleet, methods=["GET"]),
        Route("/healthz", core.healthz, methods=["GET"]),
        *fleet_page.routes(),
    ]
    app = Starlette(
        routes=routes,
        middleware=[Middleware(_AnswerGuard, core=core)],
        exception_handlers=_EXCEPTION_HANDLERS,
    )
    app.state.core = core
    return app
