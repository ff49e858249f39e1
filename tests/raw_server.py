"""A loopback TCP server that reads whole HTTP requests and answers each connection with
fixed bytes (or nothing), then closes it: a peer or a store that misbehaves on the wire in
exactly one chosen way."""

from __future__ import annotations

import socket
import ssl
import threading

WAIT = 10.0  # upper bound for every wait


class RawServer:
    """Per connection: read one whole request (head, and a body of its Content-Length), then
    write ``reply`` and close, or close without answering when ``reply`` is None. With
    ``tls`` the connection is TLS (a failed handshake just ends that connection)."""

    def __init__(self, reply: bytes | None = None, tls: ssl.SSLContext | None = None) -> None:
        self.reply = reply
        self.tls = tls
        self.requests: list[tuple[bytes, dict[str, str], bytes]] = []  # line, headers, body
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(WAIT)
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._stop = threading.Event()
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
        if self.reply is not None:
            conn.sendall(self.reply)

    def close(self) -> None:
        """Stop: wake the accepting thread with one last connection, then close."""
        self._stop.set()
        with socket.create_connection(self._sock.getsockname()[:2], timeout=WAIT):
            pass
        self._thread.join(WAIT)
        self._sock.close()
