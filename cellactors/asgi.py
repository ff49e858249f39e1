"""Run a node inside your own ASGI app (FastAPI, Starlette), see docs/web-apps.md.

:func:`node_lifespan` starts the node and its internal listener for peers (signed forwarded
calls) when the app starts, and drains and stops both when it stops. :class:`Served` then
gives :meth:`Served.acell`, an awaitable handle that calls a cell exactly as a client's
``POST /cells/...`` would: it goes through the node's public app in process, so the routing,
the signed forward to the owner, idempotency keys and error outcomes are those of the public
listener. :func:`cells_app` is that public app, to ``app.mount("/api", ...)`` behind your own
middleware.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx
import uvicorn
from starlette.applications import Starlette

from cellactors.actors.cell import CellActor
from cellactors.errors import CallError, error_from_answer
from cellactors.server.app import NodeLike, ServerSettings, build_internal_app, build_public_app
from cellactors.server.peer_calls import PeerCaller
from cellactors.server.peer_keys import KeySource, PeerKeys
from cellactors.server.push_transport import install_push_sender
from cellactors.server.runner import _serve_one, _Server, wire_limits
from cellactors.server.wire_limits import WireGuard
from cellactors.wire import codec

FleetKey = bytes | PeerKeys | KeySource

#: Seconds the internal listener may take to start before the app's start-up fails.
START_TIMEOUT = 30.0


def cells_app(
    node: NodeLike, fleet_key: FleetKey, settings: ServerSettings | None = None
) -> Starlette:
    """The node's public app (``/cells/...`` calls and feeds, ``/healthz``), to mount in
    your app so its own middleware (authentication, logging) runs first."""
    return build_public_app(node, fleet_key, settings)


@dataclass
class AsyncCell:
    """An awaitable handle on one cell: ``await handle.increment(by=2)``."""

    public: Starlette
    cls_name: str
    name: str
    key: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)

    def with_key(self, key: str) -> AsyncCell:
        """The same handle, sending ``key`` as the calls' idempotency key."""
        return AsyncCell(self.public, self.cls_name, self.name, key, self.headers)

    def __getattr__(self, method: str) -> Callable[..., Awaitable[Any]]:
        if method.startswith("_"):
            raise AttributeError(method)

        async def call(**kwargs: Any) -> Any:
            return await self.call(method, kwargs)

        return call

    async def call(self, method: str, kwargs: dict[str, Any]) -> Any:
        """Call ``method`` through the public app; its result, or its error raised with the
        outcome the node answered (``not_run`` or ``unknown``)."""
        path = "/cells/{}/{}/{}".format(
            *(quote(p, safe="") for p in (self.cls_name, self.name, method))
        )
        headers = {"Content-Type": codec.CONTENT_TYPES["json"], **self.headers}
        if self.key is not None:
            headers[codec.IDEMPOTENCY_HEADER] = self.key
        body = codec.encode(kwargs, "json")
        transport = httpx.ASGITransport(app=self.public)
        async with httpx.AsyncClient(transport=transport, base_url="http://cells") as http:
            answer = await http.post(path, content=body, headers=headers)
        try:
            payload = codec.decode(answer.content, "json")
        except CallError:
            payload = answer.text
        if answer.is_success and isinstance(payload, dict) and "result" in payload:
            return payload["result"]
        raise error_from_answer(answer.status_code, payload)


@dataclass
class Served:
    """A node serving peers from inside an ASGI app, and its in-process public app."""

    node: NodeLike
    public: Starlette
    internal_address: tuple[str, int]

    def acell(
        self,
        cls: type[CellActor] | str,
        name: str,
        *,
        key: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> AsyncCell:
        """An awaitable handle on cell ``name`` of ``cls``; ``headers`` (e.g. a caller's
        ``Authorization``) go with each call, for nodes that require authentication."""
        cls_name = cls if isinstance(cls, str) else cls.__name__
        return AsyncCell(self.public, cls_name, name, key, dict(headers or {}))


@contextlib.asynccontextmanager
async def node_lifespan(
    node: Any,
    fleet_key: FleetKey,
    internal: tuple[str, int] = ("127.0.0.1", 8081),
    settings: ServerSettings | None = None,
    *,
    sock: socket.socket | None = None,
) -> AsyncIterator[Served]:
    """Start ``node`` (a :class:`cellactors.Node` not started yet) and its internal
    listener on ``internal`` (or on ``sock``, bound already); on exit drain the node while
    the listener still answers, then stop both. Use it in your app's lifespan."""
    s = settings or ServerSettings()
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, node.start)
    peer = PeerCaller(
        node.node_id, fleet_key, s.forward_timeout, s.forward_connect_timeout, node.store_time
    )
    node.set_forwarder(peer)
    install_push_sender(node, peer)  # pushes to sockets held by other nodes
    advertised = str(getattr(node.settings, "advertise", "") or "")
    app = build_internal_app(node, fleet_key, s, internal[0], advertised)
    guard = WireGuard("internal", wire_limits(s), None, s.retry_after_seconds)
    server = _Server(
        uvicorn.Config(
            app,
            host=internal[0],
            port=internal[1],
            http=guard.protocol_class(),
            lifespan="on",
            log_config=None,
            access_log=False,
            timeout_graceful_shutdown=int(s.graceful_timeout),
        )
    )
    task = asyncio.create_task(_serve_one(server, sock, "internal"))
    sweep = asyncio.create_task(guard.sweep(server.server_state.connections))
    public = build_public_app(node, fleet_key, s)
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not server.started:
            if task.done() or time.monotonic() > deadline:
                raise RuntimeError(f"the internal listener on {internal} did not start")
            await asyncio.wait([task], timeout=0.02)
        host, port = server.servers[0].sockets[0].getsockname()[:2]
        yield Served(node, public, (str(host), int(port)))
        await loop.run_in_executor(None, node.drain)
    finally:
        server.should_exit = True
        await asyncio.gather(task, return_exceptions=True)
        sweep.cancel()
        await asyncio.gather(sweep, return_exceptions=True)
        await public.state.core.aclose()
        await loop.run_in_executor(None, node.stop)
