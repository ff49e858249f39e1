"""Run a node's public and internal apps on uvicorn, in one process and one event loop.

Graceful stop (SIGTERM/SIGINT or :meth:`Runner.request_stop`): the node drains first, in a
worker thread, while both listeners keep answering (``/healthz`` turns 503 at once because
``node.status`` changes, in-flight calls finish), then the servers stop and the exit code is
0. Self-fence (:meth:`Runner.on_fence`, callable from any thread, or ``node.status`` seen as
``"fenced"``): a line starting ``SELF-FENCE:`` is written and the runner exits with code 3.

Requests still running when the servers' grace period ends (``graceful_timeout`` after a
drain, ``fence_grace_seconds`` after a fence) are cancelled by uvicorn; the apps' answer
guard turns each into a JSON (or msgpack) 503 with its outcome class instead of uvicorn's
plain-text 500.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from enum import IntEnum
from typing import Any, TextIO

import uvicorn

from cellactors.core.sockets import CLOSE_GOING_AWAY
from cellactors.server import listener_logs
from cellactors.server.app import (
    NodeLike,
    ServerSettings,
    build_internal_app,
    build_public_app,
)
from cellactors.server.auth.authentication import check_exposure
from cellactors.server.peer_calls import PeerCaller
from cellactors.server.peer_keys import KeySource, PeerKeys
from cellactors.server.push_transport import install_push_sender
from cellactors.server.wire_limits import AbortableSocket, WireGuard, WireLimits

log = logging.getLogger("cellactors.server")


class RunEnd(IntEnum):
    """How a run of the node's servers ended (the ``serve`` command exits with it)."""

    OK = 0  # stopped on request, after a drain
    ERROR = 1  # a server failed
    FENCED = 3  # the node fenced itself


FENCED = "fenced"
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class FenceLatch:
    """A thread-safe one-shot flag the node trips when it fences itself.

    Create it before the node, hand :meth:`trip` to the node as its fence callback, and pass
    the latch to :func:`serve_node`. Tripping twice keeps the first reason.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reason: str | None = None
        self._listeners: list[Callable[[], None]] = []

    @property
    def reason(self) -> str | None:
        with self._lock:
            return self._reason

    @property
    def tripped(self) -> bool:
        return self.reason is not None

    def trip(self, reason: str) -> None:
        """Record the fence (first reason wins) and wake every listener."""
        with self._lock:
            if self._reason is not None:
                return
            self._reason = reason or "fenced"
            listeners = list(self._listeners)
        for listener in listeners:
            listener()

    def subscribe(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` (from the tripping thread) on trip; at once if already tripped."""
        with self._lock:
            self._listeners.append(listener)
            already = self._reason is not None
        if already:
            listener()


class _Server(uvicorn.Server):
    """A uvicorn server that leaves signal handling to the :class:`Runner`."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def _serve_one(server: _Server, sock: socket.socket | None, which: str) -> int:
    """Serve until told to exit, on ``sock`` if given (bound already), else on the
    config's address; uvicorn exits the process on bind failure, catch that. ``which``
    listener it is names uvicorn's lines (:mod:`cellactors.server.listener_logs`)."""
    listener_logs.LISTENER.set(which)  # this task's own context
    try:
        await server.serve(sockets=None if sock is None else [sock])
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else RunEnd.ERROR
    return RunEnd.OK


class Runner:
    """Both listeners of one node, with graceful drain and self-fence handling."""

    def __init__(
        self,
        node: NodeLike,
        fleet_key: bytes | PeerKeys | KeySource,
        *,
        public: tuple[str, int] = ("127.0.0.1", 8080),
        internal: tuple[str, int] = ("127.0.0.1", 8081),
        settings: ServerSettings | None = None,
        fence: FenceLatch | None = None,
        fence_stream: TextIO | None = None,
        access_log: bool = False,
        sockets: Mapping[str, socket.socket] | None = None,
        on_ready: Callable[[tuple[str, int], tuple[str, int]], None] | None = None,
    ) -> None:
        listener_logs.install()
        self.node = node
        #: Called with the bound (public, internal) addresses once both listeners serve.
        self.on_ready = on_ready
        self.settings = settings or ServerSettings()
        check_exposure(self.settings.authentication, public[0], self.settings.allow_anonymous)
        self.fence = fence or FenceLatch()
        self.fence_stream = fence_stream
        peer = PeerCaller(
            node.node_id,
            fleet_key,
            self.settings.forward_timeout,
            self.settings.forward_connect_timeout,
            node.store_time,
        )
        install = getattr(node, "set_forwarder", None)
        if install is not None:  # calls between cells reach other nodes' cells signed
            install(peer)
        install_push_sender(node, peer)  # and pushes, the nodes holding sockets
        self.public_app = build_public_app(node, fleet_key, self.settings)
        # Peers dial the address the node advertises in its lease: the listener answers to it.
        advertised = str(getattr(getattr(node, "settings", None), "advertise", "") or "")
        self.internal_app = build_internal_app(
            node, fleet_key, self.settings, internal[0], advertised
        )
        self._binds = {"public": public, "internal": internal}
        # Each refusal at a limit on the wire is counted in the node's metrics, when it has.
        on_refused = getattr(getattr(node, "metrics", None), "wire_refused", None)
        limits = wire_limits(self.settings)
        self._guards = {
            which: WireGuard(which, limits, on_refused, self.settings.retry_after_seconds)
            for which in self._binds
        }
        hub = getattr(self.public_app.state.core, "socket_hub", None)
        if hub is not None:
            self._guards["public"].held_sockets = lambda: len(hub.sockets)
        #: Sockets bound already (``"public"``, ``"internal"``): served as they are, so the
        #: address checked free at start-up cannot be taken before the server listens.
        self._sockets = dict(sockets or {})
        self._access_log = access_log
        self.ready = threading.Event()  # set once both listeners accept connections
        self.public_address: tuple[str, int] | None = None
        self.internal_address: tuple[str, int] | None = None
        self._lock = threading.Lock()
        self._stop_requests = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._servers: list[_Server] = []
        self.fence.subscribe(self._poke)

    def on_fence(self, reason: str) -> None:
        """The node's fence callback: thread-safe, returns at once; the runner exits 3."""
        self.fence.trip(reason)

    def request_stop(self) -> None:
        """Ask for a graceful stop (what SIGTERM does); thread-safe. A second request while
        stopping makes the servers stop without waiting for open connections."""
        with self._lock:
            self._stop_requests += 1
            force = self._stop_requests > 1
        if force:
            for server in self._servers:
                server.force_exit = True
        self._poke()

    def _poke(self) -> None:
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            with contextlib.suppress(RuntimeError):  # loop already closed
                loop.call_soon_threadsafe(wake.set)

    def install_signal_handlers(self, loop: asyncio.AbstractEventLoop) -> None:
        """Route SIGTERM and SIGINT to :meth:`request_stop` (main thread only)."""
        for sig in STOP_SIGNALS:
            loop.add_signal_handler(sig, self.request_stop)

    def remove_signal_handlers(self, loop: asyncio.AbstractEventLoop) -> None:
        for sig in STOP_SIGNALS:
            loop.remove_signal_handler(sig)

    def _config(self, which: str) -> uvicorn.Config:
        host, port = self._binds[which]
        app = self.public_app if which == "public" else self.internal_app
        return uvicorn.Config(
            app,
            host=host,
            port=port,
            http=self._guards[which].protocol_class(),
            # Sockets on the public listener only; held sockets have their own cap
            # (max_sockets), not the listener's connection cap.
            **self._ws_options(which),
            lifespan="on",
            log_config=None,
            access_log=self._access_log,
            timeout_keep_alive=math.ceil(self.settings.keep_alive_timeout),
            timeout_graceful_shutdown=int(self.settings.graceful_timeout),
        )

    def _ws_options(self, which: str) -> dict[str, Any]:
        if which != "public":
            return {"ws": "none"}  # the internal listener takes no upgrade
        return {
            "ws": AbortableSocket,  # websockets' sans-I/O protocol, with a way to drop one
            "ws_max_size": self.settings.max_socket_frame,
            "ws_per_message_deflate": False,  # a compressor per socket costs ~100 KiB
            "ws_ping_interval": 20.0,
            "ws_ping_timeout": 20.0,
        }

    def run(self, *, install_signals: bool = True) -> int:
        """Serve until stopped or fenced; the process exit code (0, 1 or 3)."""
        return asyncio.run(self.serve(install_signals=install_signals))

    async def serve(self, *, install_signals: bool = True) -> int:
        """The async body of :meth:`run`."""
        loop = asyncio.get_running_loop()
        self._loop, self._wake = loop, asyncio.Event()
        if install_signals:
            self.install_signal_handlers(loop)
        try:
            return await self._serve()
        finally:
            if install_signals:
                self.remove_signal_handlers(loop)
            self._loop = None

    async def _serve(self) -> int:
        assert self._wake is not None
        if self.fence.tripped:
            return self._fenced()
        self._servers = [_Server(self._config(which)) for which in self._binds]  # public first
        with self._lock:
            if self._stop_requests > 1:
                for server in self._servers:
                    server.force_exit = True
        tasks = [
            asyncio.create_task(_serve_one(server, self._sockets.get(which), which))
            for which, server in zip(self._binds, self._servers, strict=True)
        ]
        sweeps = [
            asyncio.create_task(self._guards[which].sweep(server.server_state.connections))
            for which, server in zip(self._binds, self._servers, strict=True)
        ]
        try:
            return await self._serve_until_stopped(tasks)
        finally:
            for sweep in sweeps:
                sweep.cancel()
            await asyncio.gather(*sweeps, return_exceptions=True)

    async def _serve_until_stopped(self, tasks: list[asyncio.Task[int]]) -> int:
        while not all(s.started for s in self._servers):
            if any(t.done() for t in tasks):
                log.error("a listener failed to start")
                await self._stop_servers(tasks)
                return RunEnd.ERROR
            await asyncio.wait(tasks, timeout=0.02)
        self.public_address = _bound_address(self._servers[0])
        self.internal_address = _bound_address(self._servers[1])
        log.info(
            "node %s serving: public %s, internal %s",
            self.node.node_id,
            url(self.public_address),
            url(self.internal_address),
        )
        self.ready.set()
        if self.on_ready is not None:
            self.on_ready(self.public_address, self.internal_address)

        code = await self._wait_for_stop(tasks)
        if code == RunEnd.OK:
            code = await self._drain()
        if self.fence.tripped:
            code = self._fenced()
            for server in self._servers:
                server.config.timeout_graceful_shutdown = int(self.settings.fence_grace_seconds)
        await self._stop_servers(tasks)
        return code

    async def _wait_for_stop(self, tasks: list[asyncio.Task[int]]) -> int:
        """Wait for a stop request, a fence, or a listener dying."""
        assert self._wake is not None
        while True:
            if self.fence.tripped:
                return RunEnd.FENCED
            with self._lock:
                if self._stop_requests:
                    return RunEnd.OK
            if self.node.status == FENCED:
                self.fence.trip("node status is fenced")
                continue
            if any(t.done() for t in tasks):
                log.error("a listener stopped unexpectedly")
                return RunEnd.ERROR
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.settings.fence_poll_interval)
            self._wake.clear()

    async def _drain(self) -> int:
        """Drain the node in a worker thread; the listeners keep answering meanwhile."""
        log.info("node %s draining", self.node.node_id)
        hub = getattr(self.public_app.state.core, "socket_hub", None)
        if hub is not None:  # its sockets' clients resume elsewhere: not closed on cells
            hub.close_all(CLOSE_GOING_AWAY, "this node is stopping; resume on another")
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(None, self.node.drain)
        except Exception:
            log.exception("drain of node %s failed", self.node.node_id)
            return RunEnd.ERROR
        log.info("node %s drained", self.node.node_id)
        return RunEnd.OK

    def _fenced(self) -> int:
        reason = self.fence.reason or "fenced"
        stream = self.fence_stream if self.fence_stream is not None else sys.stderr
        stream.write(f"SELF-FENCE: node {self.node.node_id}: {reason}\n")
        stream.flush()
        log.critical("self-fenced: %s", reason)
        return RunEnd.FENCED

    async def _stop_servers(self, tasks: list[asyncio.Task[int]]) -> None:
        for server in self._servers:
            server.should_exit = True
        await asyncio.gather(*tasks, return_exceptions=True)


def wire_limits(settings: ServerSettings) -> WireLimits:
    """The limits on the wire both listeners keep, from the settings."""
    return WireLimits(
        max_header_bytes=settings.max_header_bytes,
        max_header_count=settings.max_header_count,
        header_timeout=settings.header_timeout,
        body_timeout=settings.body_timeout,
        keep_alive_timeout=settings.keep_alive_timeout,
        max_connections=settings.max_connections,
    )


def url(address: tuple[str, int]) -> str:
    """``http://host:port`` for a bound address (an IPv6 host in brackets)."""
    host, port = address[0], address[1]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _bound_address(server: uvicorn.Server) -> tuple[str, int]:
    sock = server.servers[0].sockets[0]
    host, port = sock.getsockname()[:2]
    return str(host), int(port)


def serve_node(
    node: NodeLike,
    fleet_key: bytes | PeerKeys | KeySource,
    public: tuple[str, int] = ("127.0.0.1", 8080),
    internal: tuple[str, int] = ("127.0.0.1", 8081),
    settings: ServerSettings | None = None,
    *,
    fence: FenceLatch | None = None,
    install_signals: bool = True,
    sockets: Mapping[str, socket.socket] | None = None,
    on_ready: Callable[[tuple[str, int], tuple[str, int]], None] | None = None,
) -> int:
    """Serve ``node`` until SIGTERM (drain, exit 0) or self-fence (exit 3); the exit code.

    ``fence`` is the latch whose :meth:`FenceLatch.trip` the node calls when it fences
    itself; without one the runner still notices ``node.status == "fenced"`` by polling.
    """
    runner = Runner(
        node,
        fleet_key,
        public=public,
        internal=internal,
        settings=settings,
        fence=fence,
        sockets=sockets,
        on_ready=on_ready,
    )
    return runner.run(install_signals=install_signals)
