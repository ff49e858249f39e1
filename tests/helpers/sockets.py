"""What the socket tests share: a WebSocket handshake over a raw TCP socket (for clients
that misbehave below any client library) and a node with two callers' API keys."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

from cellactors.server.app import ServerSettings
from cellactors.server.auth import ApiKeys, Authentication

#: Two callers' API keys: ALICE's and BOB's.
KEYS = {
    "ak_alice_0123456789abcdef": {"principal": "alice", "roles": ["user"]},
    "ak_bob_0123456789abcdef01": {"principal": "bob", "roles": ["user"]},
}
ALICE, BOB = list(KEYS)


def keyed_settings(folder: Path, **more: Any) -> ServerSettings:
    """Server settings that authenticate ALICE and BOB (and nobody else)."""
    path = folder / "keys.json"
    path.write_text(json.dumps(KEYS))
    return ServerSettings(authentication=Authentication([ApiKeys(path)]), **more)


def raw_request(
    port: int, path: str, *, upgrade: bool = True, numbered: bool = False, rcvbuf: int = 0
) -> socket.socket:
    """A TCP connection that sent ``GET path`` (a WebSocket upgrade unless ``upgrade`` is
    False), with a tiny receive buffer when ``rcvbuf`` is given; nothing read yet."""
    raw = socket.create_connection(("127.0.0.1", port), timeout=30)
    if rcvbuf:
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    head = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    if upgrade:
        head += (
            "Upgrade: websocket\r\nConnection: Upgrade\r\n"
            "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
        )
        if numbered:
            head += "Sec-WebSocket-Protocol: cellactors.v1\r\n"
    raw.sendall((head + "\r\n").encode())
    return raw
