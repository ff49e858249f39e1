"""A loopback TCP server that reads whole HTTP requests and answers each connection with
fixed bytes (or nothing), then closes it: a peer or a store that misbehaves on the wire in
exactly one chosen way (it may also reset connections, or not listen yet)."""

from __future__ import annotations

import socket
import ssl
import struct
import threading
from typing import Literal

WAIT = 10.0  # upper bound for every wait
#: Arguments too large to fit in the socket buffers of a loopback connection whose receiver
#: reads nothing: writing them blocks until the receiver's reset fails the write.
BIG = "x" * (24 << 20)
#: What the server does with each connection: read the whole request and answer ``reply``
#: (or close), or reset the connection (RST) after reading the head only, or the whole
#: request.
Mode = Literal["answer", "reset_after_head", "reset_after_request"]


class RawServer:
    """Per connection: read one whole request (head, and a body of its Content-Length), then
    write ``reply`` and close, or close without answering when ``reply`` is None. With
    ``tls`` the connection is TLS (a failed handshake just ends that connection). ``mode``
    may reset connections instead (see :data:`Mode`); ``heads`` counts the request heads
    read. With ``listening=False`` the port is bound but refuses connections until
    :meth:`listen`."""

    def __init__(
        self,
        reply: bytes | None = None,
        tls: ssl.SSLContext | None = None,
        mode: Mode = "answer",
        listening: bool = True,
    ) -> None:
        self.reply = reply
        self.tls = tls
        self.mode = mode
        self.heads = 0
        self.requests: list[tuple[bytes, dict[str, str], bytes]] = []  # line, headers, body
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if mode == "reset_after_head":  # a small window: a large body cannot all be sent
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.settimeout(WAIT)
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._stop = threading.Event()
        self._listening = False
        if listening:
            self.listen()

    def listen(self) -> None:
        """Start accepting connections (until now, connecting was refused)."""
        self._sock.listen()
        self._listening = True
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self._sock.getsockname()[:2]
        return f"{'https' if self.tls else 'http'}://{host}:{port}"

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            if self._stop.is_set():
                conn.close()
                return
            if self.tls is not None:
                try:
                    conn = self.tls.wrap_socket(conn, server_side=True)
                except OSError:
                    conn.close()
                    continue
            with conn:
                conn.settimeout(WAIT)
                self._answer(conn)

    def _answer(self, conn: socket.socket) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                break
            data += chunk
        self.heads += 1
        if self.mode == "reset_after_head":
            _reset(conn)
            return
        head, _, body = data.partition(b"\r\n\r\n")
        line, *header_lines = head.split(b"\r\n")
        headers = {}
        for raw in header_lines:
            name, _, value = raw.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        while len(body) < length:
            chunk = conn.recv(65536)
            if not chunk:
                break
            body += chunk
        self.requests.append((line, headers, body))
        if self.mode == "reset_after_request":
            _reset(conn)
        elif self.reply is not None:
            conn.sendall(self.reply)

    def close(self) -> None:
        """Stop: wake the accepting thread with one last connection, then close."""
        self._stop.set()
        if self._listening:
            with socket.create_connection(self._sock.getsockname()[:2], timeout=WAIT):
                pass
            self._thread.join(WAIT)
        self._sock.close()


def _reset(conn: socket.socket) -> None:
    """Close ``conn`` with a TCP reset (RST) instead of an orderly FIN."""
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.close()
