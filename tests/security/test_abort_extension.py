"""The limited listener hands every request a way to drop its connection at once (the ASGI
scope's ``cellactors.abort``): a stream abandoned mid-answer (an event stream whose client
stopped reading) is reset, not closed, which would keep it open until its buffer drained."""

from __future__ import annotations

import asyncio
import socket
import threading
from typing import Any

import anyio
import httpx
import pytest
import uvicorn

from cellactors.persistence.store.embedded import free_port
from cellactors.server.handling import ServerSettings
from cellactors.server.runner import wire_limits
from cellactors.server.wire_limits import ABORT_EXTENSION, WireGuard

CHUNK = 8 * 1024 * 1024  # more than the kernel's buffers on both sides hold


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """``/whole`` answers in full; ``/abort`` writes more than a client that does not read
    can take, and once a write has waited a moment, drops the connection."""
    if scope["type"] != "http":
        return
    abort = scope.get("extensions", {}).get(ABORT_EXTENSION)
    await send({"type": "http.response.start", "status": 200, "headers": []})
    if scope["path"] == "/abort":
        with anyio.move_on_after(0.5):
            while True:
                await send({"type": "http.response.body", "body": b"x" * CHUNK, "more_body": True})
        if abort is not None:  # without it, uvicorn closes: the buffer drains to the client
            abort()
        return
    await send({"type": "http.response.body", "body": b"whole", "more_body": False})


@pytest.fixture
def server() -> Any:
    port = free_port()
    guard = WireGuard("public", wire_limits(ServerSettings()))
    config = uvicorn.Config(app, host="127.0.0.1", port=port, http=guard.protocol_class())
    config.log_level = "warning"
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=lambda: asyncio.run(srv.serve()), daemon=True)
    thread.start()
    try:
        with httpx.Client() as probe:
            for _ in range(200):
                try:
                    probe.get(f"http://127.0.0.1:{port}/whole", timeout=1)
                    break
                except httpx.TransportError:
                    threading.Event().wait(0.05)
        yield port
    finally:
        srv.should_exit = True
        thread.join(10)


def test_every_request_can_drop_its_connection(server: int) -> None:
    assert httpx.get(f"http://127.0.0.1:{server}/whole", timeout=5).text == "whole"
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a client that reads little
        sock.settimeout(10)
        sock.connect(("127.0.0.1", server))
        sock.sendall(b"GET /abort HTTP/1.1\r\nHost: x\r\n\r\n")
        threading.Event().wait(1.5)  # it reads nothing while the server gives up on it
        got = 0
        try:
            while chunk := sock.recv(1 << 20):
                got += len(chunk)
        except ConnectionResetError:
            pass
    # Dropped: what the server still buffered was discarded, not drained to the client.
    assert 0 < got < CHUNK
