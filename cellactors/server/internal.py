"""The node's internal app, which must listen on a private address: signed forwarded calls
from peers (``POST /internal/cells/...``), the operator endpoints (``GET /state``,
``GET /metrics``, ``GET /fleet``, ``GET /healthz``, the fleet page at ``GET /``), and a
cell's dead letters at ``/cells/{cls}/{name}/dead-letters`` (signed too: they show and
change message arguments)."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any

import anyio
import anyio.to_thread
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

import cellactors.errors as errors
from cellactors.core import keys, principal
from cellactors.core.principal import Principal
from cellactors.errors import (
    NOT_RUN,
    BadRequest,
    BucketError,
    BucketUnavailable,
    DeadLetterNotFound,
    RemoteOwner,
    StaleRoute,
    UnknownCell,
)
from cellactors.server import call_span, fleet_page, hosts, signing
from cellactors.server.cell_admin import (
    ROLLBACK_BODY_LIMIT,
    purge_here,
    roll_back_here,
    rollback_point,
)
from cellactors.server.forward import CHAIN_HEADER, INTERNAL_CELL_ROUTE, decode_chain
from cellactors.server.handling import (
    DEAD_LETTERS_ROUTE,
    EXCEPTION_HANDLERS,
    NODE_HEADER,
    AnswerGuard,
    Core,
    NodeLike,
    ServerSettings,
    as_call_error,
    hand_over,
)
from cellactors.server.inspector import Inspector
from cellactors.server.peer_keys import KeySource, PeerKeys
from cellactors.server.push_transport import PUSHES_ROUTE, receive_pushes
from cellactors.tracing import spans
from cellactors.wire import codec

log = logging.getLogger("cellactors.server")

#: Purging a cell (``DELETE``) and rolling it back (``POST .../rollback``): operator
#: endpoints signed with the fleet key.
CELL_ROUTE = "/cells/{cls_name}/{name}"


class _InternalCore(Core):
    """Signed forwarded calls from peers, and the operator endpoints."""

    def __init__(
        self, node: NodeLike, fleet_key: bytes | PeerKeys | KeySource, settings: ServerSettings
    ) -> None:
        super().__init__(node, fleet_key, settings)
        self.nonces = signing.NonceCache(settings.signature_window, settings.nonce_cache_size)
        self._fleet: tuple[float, dict[str, Any]] | None = None  # (monotonic time, answer)
        self._fleet_lock = anyio.Lock()

    async def handle_call(self, request: Request) -> Response:
        """A peer's forwarded call: refused unless signed for this process; then run in its
        server span, whose parent is the trace context the peer signed (a request that is
        not signed makes no span: nobody can graft it onto a trace)."""
        params = request.path_params
        cls_name, name, method = params["cls_name"], params["name"], params["method"]
        encoding = codec.encoding_for(request.headers.get("content-type"))
        try:
            # A forwarded socket message carries a frame of up to max_socket_frame bytes.
            limit = max(self.settings.max_body_bytes, self.settings.max_socket_frame + (64 << 10))
            body = await codec.read_body(
                request.stream(), request.headers.get("content-length"), limit
            )
            source = signing.verify_request(
                self.keys().accepted,
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
        except ClientDisconnect:
            raise  # the answer guard logs it; nobody is left to answer
        except Exception as e:
            err = as_call_error(e)
            if isinstance(err, errors.Unauthorized):
                log.warning("refused peer call %s: %s", request.url.path, err)
            return self.error(err, encoding)
        parent = spans.parent_from(request.headers.get(signing.TRACE_HEADER))  # signed
        return await call_span.traced(
            parent,
            cls_name,
            name,
            method,
            lambda: self._run_signed(request, body, source, encoding),
        )

    async def _run_signed(
        self, request: Request, body: bytes, source: str, encoding: codec.Encoding
    ) -> Response:
        """Run a verified peer call and answer it."""
        cls_name = request.path_params["cls_name"]
        name = request.path_params["name"]
        method = request.path_params["method"]
        check = codec.ResultCheck(encoding)
        try:
            key = codec.idempotency_key(request.headers.getlist(codec.IDEMPOTENCY_HEADER))
            self.check_target(cls_name, name, method, peer=True)
            kwargs = codec.decode_kwargs(body, encoding)
            chain = decode_chain(request.headers.get(CHAIN_HEADER))  # a call between cells
            caller = _caller(request)  # covered by the signature just verified
            hand_over(request)
            blocking = functools.partial(
                self._call, cls_name, name, method, kwargs, key, check, chain, caller
            )
            if chain:  # a call between cells: its cycle check is the blocking path's
                result = await self.run(blocking)
            else:
                result = await self.run_call(
                    cls_name, name, method, kwargs, key, check, blocking, caller
                )
        except ClientDisconnect:
            raise  # the answer guard logs it; nobody is left to answer
        except RemoteOwner as e:
            # Runtime contract says this cannot happen for forwarded calls; never multi-hop.
            return self.error(StaleRoute(f"not the owner of {cls_name}:{name} ({e})"), encoding)
        except Exception as e:
            return self.error(as_call_error(e), encoding)
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
        caller: Principal | None = None,
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
            caller=caller,
        )

    # --- dead letters (operator endpoints, signed with the fleet key) ---------------------

    async def list_dead_letters(self, request: Request) -> Response:
        """``GET /cells/{cls}/{name}/dead-letters``: the cell's dead letters, oldest first."""
        return await self._operator_request(
            request,
            lambda cls, name, _ids, _body: [x.to_dict() for x in self.node.dead_letters(cls, name)],
        )

    async def retry_dead_letters(self, request: Request) -> Response:
        """``POST .../dead-letters/retry`` (all) or ``POST .../dead-letters/{letter}/retry``:
        move dead letters back into the outbox; answers the ids moved."""
        retry = self.node.retry_dead_letters
        return await self._operator_request(
            request, lambda cls, name, ids, _body: retry(cls, name, ids), "retried"
        )

    async def purge_dead_letters(self, request: Request) -> Response:
        """``DELETE .../dead-letters`` (all) or ``DELETE .../dead-letters/{letter}``: delete
        dead letters for good; answers the ids deleted."""
        drop = self.node.purge_dead_letters
        return await self._operator_request(
            request, lambda cls, name, ids, _body: drop(cls, name, ids), "purged"
        )

    async def purge_cell(self, request: Request) -> Response:
        """``DELETE /cells/{cls}/{name}``: purge the cell through this node (it lets go of
        its own copy first: :mod:`cellactors.actors.node.purging`), signed with the fleet key
        like the dead-letter routes; answers ``{"purged": [{cell, fenced_epoch, deleted}]}``."""
        return await self._operator_request(request, self._purge, "purged")

    def _purge(self, cls_name: str, name: str, _ids: list[str] | None, _body: bytes) -> list[Any]:
        return purge_here(self.node, cls_name, name)

    async def roll_back_cell(self, request: Request) -> Response:
        """``POST /cells/{cls}/{name}/rollback`` with ``{"to_txid": N}`` or ``{"at_ms": T}``:
        roll the cell back in place through this node
        (:mod:`cellactors.actors.node.rolling_back`), signed with the fleet key; answers
        ``{"rolled_back": [{cell, to_txid, txid, undo_txid}]}``."""
        return await self._operator_request(
            request, self._roll_back, "rolled_back", ROLLBACK_BODY_LIMIT
        )

    def _roll_back(
        self, cls_name: str, name: str, _ids: list[str] | None, body: bytes
    ) -> list[Any]:
        return roll_back_here(self.node, cls_name, name, rollback_point(body))

    async def _operator_request(
        self,
        request: Request,
        act: Callable[[str, str, list[str] | None, bytes], list[Any]],
        done: str = "dead_letters",
        max_body: int = 0,
    ) -> Response:
        """Verify the operator's signature, run ``act`` on the cell in a worker thread (it
        may activate the cell here) and answer ``{done: [...]}``. A cell a live peer owns is
        409 ``remote_owner`` with that node's internal address; a named letter that is not
        there is 404 ``dead_letter_not_found``."""
        cls_name = request.path_params["cls_name"]
        name = request.path_params["name"]
        letter = request.path_params.get("letter")
        try:
            body = await codec.read_body(
                request.stream(), request.headers.get("content-length"), max_body
            )
            signing.verify_request(
                self.keys().accepted,
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
            result = await self.run(act, cls_name, name, ids, body)
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
            err = as_call_error(e)
            if isinstance(err, errors.Unauthorized):
                log.warning("refused operator request %s: %s", request.url.path, err)
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
        try:
            answer = await self.fleet_answer()
        except BucketError as e:
            refused = self.error(BucketUnavailable(f"could not read the node leases: {e}"), "json")
            refused.headers["Cache-Control"] = "no-store"
            return refused
        return JSONResponse(answer, headers=headers)

    async def fleet_answer(self) -> dict[str, Any]:
        """``Node.fleet``, read at most once per ``fleet_cache_seconds`` (``/fleet`` and the
        inspector's fleet history share it)."""
        async with self._fleet_lock:
            cached = self._fleet
            if cached is None or time.monotonic() - cached[0] >= self.settings.fleet_cache_seconds:
                self._fleet = None
                cached = self._fleet = (
                    time.monotonic(),
                    await anyio.to_thread.run_sync(self.node.fleet),
                )
        return cached[1]


def build_internal_app(
    node: NodeLike,
    fleet_key: bytes | PeerKeys | KeySource,
    settings: ServerSettings | None = None,
    bound: str = "",
    advertised: str = "",
) -> Starlette:
    """The peer/operator app: signed forwarded calls, state, metrics, fleet, health check,
    and the fleet page. It answers only to its own names in ``Host`` (:mod:`.hosts`):
    loopback, ``bound`` (the host it listens on), ``advertised`` (the address peers dial,
    from the node's lease) and ``settings.internal_hosts``."""
    core = _InternalCore(node, fleet_key, settings or ServerSettings())
    names = hosts.own_names(bound, (advertised, *core.settings.internal_hosts))
    routes = [
        Route(INTERNAL_CELL_ROUTE, core.handle_call, methods=["POST"]),
        Route(DEAD_LETTERS_ROUTE, core.list_dead_letters, methods=["GET"]),
        Route(CELL_ROUTE, core.purge_cell, methods=["DELETE"]),
        Route(CELL_ROUTE + "/rollback", core.roll_back_cell, methods=["POST"]),
        Route(DEAD_LETTERS_ROUTE, core.purge_dead_letters, methods=["DELETE"]),
        Route(DEAD_LETTERS_ROUTE + "/retry", core.retry_dead_letters, methods=["POST"]),
        Route(DEAD_LETTERS_ROUTE + "/{letter}", core.purge_dead_letters, methods=["DELETE"]),
        Route(DEAD_LETTERS_ROUTE + "/{letter}/retry", core.retry_dead_letters, methods=["POST"]),
        Route(PUSHES_ROUTE, functools.partial(receive_pushes, core, core.nonces), methods=["POST"]),
        Route("/state", core.state, methods=["GET"]),
        Route("/metrics", core.metrics, methods=["GET"]),
        Route("/fleet", core.fleet, methods=["GET"]),
        Route("/healthz", core.healthz, methods=["GET"]),
        *fleet_page.routes(),
        *Inspector(core, core.fleet_answer).routes(),
    ]
    app = Starlette(
        routes=routes,
        middleware=[Middleware(AnswerGuard, core=core), Middleware(hosts.HostCheck, names=names)],
        exception_handlers=EXCEPTION_HANDLERS,
    )
    app.state.core = core
    return app


def _caller(request: Request) -> Principal | None:
    """The originating caller a verified peer request names (None: anonymous)."""
    try:
        return principal.decode(request.headers.get(signing.CALLER_HEADER))
    except ValueError as e:
        raise BadRequest(f"malformed caller header: {e}") from None
