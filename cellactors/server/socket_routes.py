"""Sockets on the public listener: ``GET /cells/{cls}/{name}/ws`` (a WebSocket) and
``GET /cells/{cls}/{name}/events`` (the cell's pushes as server-sent events).

Both are admitted like a call of the class's ``on_connect`` (its access rule, then
``authorize``), after an ``Origin`` check: a browser page may open one only from an origin
the node allows (``--cors-origin``) or from the node's own, since a socket has no CORS
preflight to stop it. A browser cannot set ``Authorization`` on a WebSocket, so a bearer
token may come as the subprotocol ``cellactors.bearer.<token>`` instead.

A client that asks for the subprotocol ``cellactors.v1`` gets numbered frames: first
``{"conn": id, "seq": n}``, then each text push as ``{"seq": n, "text": ...}`` and each
binary push as 8 bytes of its number (big-endian) and the data. With ``?resume=<id>&after=<n>``
it takes its socket back on any node after its holder went away, missing nothing retained.
Without it, frames are the cell's data as sent. Event streams number events
``<conn>.<seq>``, so an ``EventSource`` resumes by itself (``Last-Event-ID``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import secrets
from collections.abc import AsyncIterator, Callable
from typing import Any, cast

import httpx
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import BaseRoute, Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from cellactors.actors.sockets import SOCKET_METHOD, check_resumable
from cellactors.core import keys, sockets
from cellactors.core.principal import Principal
from cellactors.core.sockets import Holder, Push
from cellactors.errors import (
    BadRequest,
    CallError,
    Forbidden,
    InvalidCellId,
    MethodFailed,
    NodeUnavailable,
    SocketGone,
    SocketMissed,
    UnknownCell,
)
from cellactors.server import forward, peer_calls
from cellactors.server.auth.admission import admit_call
from cellactors.server.handling import Core, as_call_error
from cellactors.server.hosts import host_name
from cellactors.server.socket_hub import HeldSocket, SocketHub
from cellactors.server.wire_limits import ABORT_EXTENSION, SEND_NOW_EXTENSION

log = logging.getLogger(__name__)

WS_ROUTE = "/cells/{cls_name}/{name}/ws"
EVENTS_ROUTE = "/cells/{cls_name}/{name}/events"
BEARER_PREFIX = "cellactors.bearer."


def _offered(scope: Any) -> list[str]:
    return [str(p) for p in scope.get("subprotocols", ())]


def _headers_with_token(headers: Any, offered: list[str]) -> dict[str, str]:
    """The request's headers, with a bearer token offered as a subprotocol as
    ``Authorization`` (a header the client sent wins)."""
    out = {k.lower(): v for k, v in headers.items()}
    for proto in offered:
        if proto.startswith(BEARER_PREFIX) and "authorization" not in out:
            out["authorization"] = "Bearer " + proto[len(BEARER_PREFIX) :]
    return out


def origin_allowed(headers: Any, allowed: tuple[str, ...]) -> bool:
    """No ``Origin`` (not a browser), one the node allows, or the node's own host."""
    origin = headers.get("origin")
    if origin is None:
        return True
    if origin in allowed:
        return True
    _, _, rest = origin.partition("://")
    host = headers.get("host")
    return host is not None and rest.lower() == host.lower() and bool(host_name(host))


class SocketRoutes:
    """The two routes and the hub behind them (one per public app)."""

    def __init__(self, core: Core, node: Any, hub: SocketHub) -> None:
        self.core = core
        self.node = node
        self.hub = hub

    # --- what both routes share -----------------------------------------------------------

    def admit(self, cls_name: str, name: str, headers: dict[str, str]) -> Principal | None:
        """The caller who may open a socket on ``cls_name:name``; raises the refusal."""
        cls = self.node.classes.get(cls_name)
        if cls is None or not getattr(cls, "takes_sockets", lambda: False)():
            raise UnknownCell(f"no cell class {cls_name!r} that takes sockets is served here")
        keys.make_cell_id(cls_name, name)
        if not origin_allowed(headers, self.core.settings.cors_origins):
            raise Forbidden(f"sockets from origin {headers.get('origin')!r} are not allowed")
        caller = admit_call(self.core.settings.authentication, cls, name, "on_connect", headers)
        if len(self.hub.sockets) >= self.core.settings.max_sockets:
            raise NodeUnavailable("this node holds its most sockets; try another node")
        return caller

    async def open(
        self,
        cell_id: str,
        caller: Principal | None,
        sock: HeldSocket,
        kind: str,
        tags: list[str],
        resume: tuple[str, int] | None,
    ) -> int:
        """Connect (or resume) ``sock`` on its cell and hold it here; raises the refusal.
        Returns where its client starts: the last push before it opened (or resumed); its
        own pushes, already queued, come after."""
        holder = self.hub.holder.to_wire()
        fields: dict[str, Any]
        if resume is None:
            fields = {
                "event": "connect",
                "conn": sock.id,
                "holder": holder,
                "tags": tags,
                "kind": kind,
            }
            self.hub.add(sock)  # before the answer: on_connect's pushes may come first
            try:
                answer = await self.hub.event(cell_id, fields, caller, f"ws.{sock.id}.open")
            except BaseException:
                self.hub.remove(sock)
                raise
            start = int(answer["head"])
            sock.cursor = max(sock.cursor, start)  # a sync may have passed it pushes already
            self.hub.joined(cell_id, answer)
            return start
        conn_id, after = resume
        fields = {"event": "resume", "conn": conn_id, "holder": holder, "after": after}
        sock.cursor = after
        # Its client's earlier connection, held here still: it keeps the socket's pushes
        # until the cell has said the resume is the caller's (a refused one changes nothing).
        displaced = self.hub.sockets.get(conn_id)
        if displaced is None:
            self.hub.add(sock)  # pushes for it may come here as soon as the cell moved it
        try:
            answer = await self.hub.event(cell_id, fields, caller)
            check_resumable(answer, conn_id)
        except BaseException:
            self.hub.remove(sock)
            raise
        if displaced is not None:
            self.hub.add(sock)
            displaced.shut(sockets.CLOSE_GONE, "resumed on another connection")
        self.hub.caught_up(cell_id, answer, synced=False)
        if displaced is not None:
            self.hub.sync_soon(cell_id)  # whatever went to the earlier one meanwhile
        return after

    async def closed(
        self,
        cell_id: str,
        sock: HeldSocket,
        caller: Principal | None,
        code: int,
        reason: str,
        dropped: bool = False,
    ) -> None:
        """The client closed ``sock``: its cell hears of it (``on_close``), unless the
        socket was resumed on another connection meanwhile. A ``dropped`` connection (no
        close from its client) may be resumed for ``socket_resume_grace`` seconds first."""
        if self.hub.sockets.get(sock.id) is not sock:
            return
        self.hub.remove(sock)
        if dropped:
            await asyncio.sleep(self.core.settings.socket_resume_grace)
            if sock.id in self.hub.sockets:
                return  # resumed here: the socket lives on
        fields = {
            "event": "close",
            "conn": sock.id,
            "holder": self.hub.holder.to_wire(),
            "code": code,
            "reason": sockets.close_reason(reason),
        }
        try:
            await self.hub.event(cell_id, fields, caller, f"ws.{sock.id}.close")
        except CallError as err:
            log.info("close of socket %s not told to %s: %s", sock.id, cell_id, err)

    # --- WebSocket ----------------------------------------------------------------------

    async def websocket(self, ws: WebSocket) -> None:
        cls_name = ws.path_params["cls_name"]
        name = ws.path_params["name"]
        offered = _offered(ws.scope)
        numbered = sockets.SUBPROTOCOL in offered
        try:
            caller = self.admit(cls_name, name, _headers_with_token(ws.headers, offered))
            resume = _resume(ws.query_params.get("resume"), ws.query_params.get("after"))
            tags = ws.query_params.getlist("tag")
        except (CallError, InvalidCellId) as err:
            await _refuse(ws, as_call_error(err), numbered)
            return
        await ws.accept(subprotocol=sockets.SUBPROTOCOL if numbered else None)
        cell_id = keys.make_cell_id(cls_name, name)
        conn_id = resume[0] if resume else sockets.new_conn_id()
        sock = HeldSocket(conn_id, cell_id, 0, _ws_sender(ws, numbered), _ws_closer(ws))
        sock.send_now = _ws_send_now(ws, numbered)
        try:
            start = await self.open(cell_id, caller, sock, "websocket", tags, resume)
        except (CallError, ValueError) as err:
            await _close_for(ws, err, opening=True)
            return
        try:
            if numbered:
                await ws.send_text(json.dumps({"conn": conn_id, "seq": start}))
            sock.release()
            await self._converse(ws, cell_id, sock, caller)
        finally:
            if self.hub.sockets.get(sock.id) is sock:  # its client went before its hello
                gone = self.closed(cell_id, sock, caller, sockets.CLOSE_HOLDER_LOST, "", True)
                self.hub.spawn(gone)

    async def _converse(
        self, ws: WebSocket, cell_id: str, sock: HeldSocket, caller: Principal | None
    ) -> None:
        session = secrets.token_hex(4)  # keys of this holding never meet an earlier one's
        count = 0
        code, reason = sockets.CLOSE_NORMAL, ""
        try:
            while True:
                message = await ws.receive()
                if message["type"] == "websocket.disconnect":
                    code = int(message.get("code") or sockets.CLOSE_NORMAL)
                    reason = str(message.get("reason") or "")
                    break
                data = message.get("text")
                if data is None:
                    data = message.get("bytes")
                if data is None or sock.closed:
                    continue
                count += 1
                fields = {"event": "message", "conn": sock.id, "data": data}
                key = f"ws.{sock.id}.{session}.{count}"
                try:
                    await self.hub.event(cell_id, fields, caller, key)
                except (CallError, ValueError) as err:
                    await _close_for(ws, err)
                    sock.closed = True
                    code, reason = sockets.CLOSE_FAILED, sockets.close_reason(str(err))
                    break
        except WebSocketDisconnect as err:
            code, reason = err.code, str(err.reason or "")
        if self.hub.stopping:
            self.hub.remove(sock)  # the node stops: the client resumes elsewhere
            return
        if code == sockets.CLOSE_SERVICE_RESTART:  # the listener stops (uvicorn's close)
            self.hub.remove(sock)  # its client resumes elsewhere
            return
        # No close code (1005: the connection ended, or a close frame without one; 1006): it
        # may come back to resume. A client that means to leave closes with a code.
        dropped = code in (sockets.CLOSE_NO_STATUS, sockets.CLOSE_HOLDER_LOST)
        self.hub.spawn(self.closed(cell_id, sock, caller, code, reason, dropped))

    # --- server-sent events -------------------------------------------------------------

    async def events(self, request: Request) -> Response:
        cls_name = request.path_params["cls_name"]
        name = request.path_params["name"]
        try:
            caller = self.admit(cls_name, name, dict(request.headers))
            resume = _event_resume(request.headers.get("last-event-id"))
            tags = request.query_params.getlist("tag")
        except (CallError, InvalidCellId) as err:
            return self.core.error(as_call_error(err), "json")
        cell_id = keys.make_cell_id(cls_name, name)
        queue: asyncio.Queue[str | None] = asyncio.Queue(maxsize=EVENT_QUEUE)
        conn_id = resume[0] if resume else sockets.new_conn_id()
        ended = asyncio.Event()

        async def send(push: Push) -> None:
            await queue.put(_event_frame(conn_id, push))

        closing: list[str] = []

        async def close(code: int, reason: str) -> None:
            detail = json.dumps({"code": code, "reason": reason})
            closing.append(f"event: close\ndata: {detail}\n\n")
            with contextlib.suppress(asyncio.QueueFull):
                queue.put_nowait(None)  # wakes a reader waiting for a frame
            try:
                await asyncio.wait_for(ended.wait(), CLOSE_WAIT_S)
            except asyncio.TimeoutError:  # stuck writing to a reader that reads nothing
                abort = request.scope.get("extensions", {}).get(ABORT_EXTENSION)
                if abort is not None:
                    abort()

        sock = HeldSocket(conn_id, cell_id, 0, send, close)
        try:
            start = await self.open(cell_id, caller, sock, "events", tags, resume)
        except (CallError, ValueError) as err:
            return self.core.error(as_call_error(err), "json")

        async def stream() -> AsyncIterator[bytes]:
            yield f"retry: 1000\nid: {conn_id}.{start}\ndata: \n\n".encode()
            sock.release()
            try:
                while not closing:
                    try:
                        frame = await asyncio.wait_for(
                            queue.get(), self.core.settings.feed_heartbeat
                        )
                    except asyncio.TimeoutError:  # not the builtin before 3.11
                        yield b": heartbeat\n\n"
                        continue
                    if frame is not None:
                        yield frame.encode()
                yield closing[0].encode()
            finally:
                ended.set()
                if self.hub.stopping:
                    self.hub.remove(sock)  # the node stops: the client resumes elsewhere
                else:  # a task of its own: this generator may be closing by cancellation
                    # An event stream never says goodbye: its reader may be back.
                    gone = self.closed(cell_id, sock, caller, sockets.CLOSE_GOING_AWAY, "", True)
                    self.hub.spawn(gone)

        return StreamingResponse(
            stream(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )


def _resume(conn: str | None, after: str | None) -> tuple[str, int] | None:
    if conn is None:
        return None
    if not sockets.valid_conn_id(conn):
        raise BadRequest("resume names a socket id of 22 URL-safe characters")
    if after is None or not after.isdigit() or len(after) > 19:
        raise BadRequest("resume needs after=<the number of the last frame seen>")
    return conn, int(after)


def _event_resume(last: str | None) -> tuple[str, int] | None:
    if not last:
        return None
    conn, _, seq = last.partition(".")
    return _resume(conn, seq)


def _event_frame(conn_id: str, push: Push) -> str:
    if push.kind == sockets.BYTES:
        data = base64.b64encode(cast(bytes, push.data)).decode()
        return f"id: {conn_id}.{push.seq}\nevent: bytes\ndata: {data}\n\n"
    lines = "\n".join(f"data: {line}" for line in str(push.data).split("\n"))
    return f"id: {conn_id}.{push.seq}\n{lines}\n\n"


def _frame(push: Push, numbered: bool) -> str | bytes:
    """What a push is on the wire (see the module)."""
    if push.kind == sockets.BYTES:
        data = cast(bytes, push.data)
        return push.seq.to_bytes(8, "big") + data if numbered else data
    if numbered:
        return json.dumps({"seq": push.seq, "text": push.data})
    return str(push.data)


def _ws_sender(ws: WebSocket, numbered: bool) -> Any:
    async def send(push: Push) -> None:
        frame = _frame(push, numbered)
        if isinstance(frame, bytes):
            await ws.send_bytes(frame)
        else:
            await ws.send_text(frame)

    return send


def _ws_send_now(ws: WebSocket, numbered: bool) -> Callable[[Push], bool] | None:
    """The listener's way to write a frame at once, when it has one."""
    write = ws.scope.get("extensions", {}).get(SEND_NOW_EXTENSION)
    if write is None:
        return None
    return lambda push: bool(write(_frame(push, numbered)))


#: How long a close may wait for the client to take it before the socket is dropped.
CLOSE_WAIT_S = 2.0
#: Events an event stream holds ready for its reader: past them, its socket's writer
#: waits, and its unsent frames count in the socket's buffer (cut off past the limit).
EVENT_QUEUE = 1


def _ws_closer(ws: WebSocket) -> Any:
    async def close(code: int, reason: str) -> None:
        try:
            await asyncio.wait_for(ws.close(code, reason), CLOSE_WAIT_S)
        except RuntimeError:
            pass  # closed already
        except asyncio.TimeoutError:  # a client that reads nothing cannot take a close
            abort = ws.scope.get("extensions", {}).get(ABORT_EXTENSION)
            if abort is not None:
                abort()

    return close


def _close_code(err: BaseException, opening: bool) -> int:
    if isinstance(err, SocketGone):
        return sockets.CLOSE_GONE
    if isinstance(err, SocketMissed):
        return sockets.CLOSE_MISSED
    if isinstance(err, MethodFailed) and opening:  # on_connect raised: it refused the socket
        return sockets.CLOSE_REFUSED
    if isinstance(err, CallError) and err.status in (401, 403):
        return sockets.CLOSE_REFUSED
    if isinstance(err, CallError) and err.status == 503:
        return sockets.CLOSE_TRY_LATER
    return sockets.CLOSE_FAILED


async def _close_for(ws: WebSocket, err: BaseException, opening: bool = False) -> None:
    code = _close_code(err, opening)
    try:
        await ws.close(code, sockets.close_reason(f"{getattr(err, 'code', 'error')}: {err}"))
    except RuntimeError:
        pass


async def _refuse(ws: WebSocket, err: CallError, numbered: bool) -> None:
    """Refuse before accepting: the handshake answers the error's status (a browser sees
    only that it failed; other clients read the status)."""
    del numbered
    await ws.send_denial_response(
        Response(json.dumps(err.to_dict()), status_code=err.status, media_type="application/json")
    )


async def owner_alive(http: httpx.AsyncClient, owner: Holder) -> bool:
    """Whether ``owner``'s process still serves (its internal ``/healthz`` names it): one
    that is gone, restarted, draining or fenced may have sent less than it acknowledged."""
    try:
        answer = await http.get(forward.base_url(owner.addr) + "/healthz", timeout=2.0)
        body = answer.json()
        return bool(body.get("generation") == owner.generation and body.get("status") == "serving")
    except (httpx.HTTPError, ValueError, AttributeError):
        return False


def routes(core: Core, node: Any) -> list[BaseRoute]:
    """The socket routes of a public app over ``node``, and its hub installed on the node
    (none for a node without sockets, such as a test's stand-in)."""
    pushes = getattr(node, "pushes", None)
    if pushes is None:
        return []
    holder: Holder = pushes.holder

    async def run_event(
        cell_id: str, fields: dict[str, Any], caller: Principal | None, key: str | None
    ) -> Any:
        cls_name, _, name = cell_id.partition(":")

        def call() -> Any:
            with peer_calls.patience(node.settings.lease_ttl + 1.0):
                return node.call_cell(cls_name, name, SOCKET_METHOD, fields, key=key, caller=caller)

        return await core.run(call)

    hub = SocketHub(holder, run_event, max_buffer=core.settings.max_socket_buffer)
    pushes.hub = hub
    core.socket_hub = hub
    r = SocketRoutes(core, node, hub)
    return [WebSocketRoute(WS_ROUTE, r.websocket), Route(EVENTS_ROUTE, r.events, methods=["GET"])]
