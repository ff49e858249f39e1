"""Keep-alive HTTP/1.1 connections to one store, for the direct S3 path.

The direct path (:mod:`cellactors.persistence.store.s3_direct`) sends small requests whose
answers always declare their length: S3 objects and listings. Reading such an answer needs
only its status line, a few headers and exactly ``Content-Length`` bytes, so this module
does just that on a plain (or TLS) socket, at about half the CPU of :mod:`http.client`
(whose header parsing goes through the ``email`` package).

It is strict rather than general: an answer it does not fully understand (no declared
length, a transfer encoding, an interim ``1xx``, bytes beyond the body, a header block
larger than :data:`MAX_HEAD`) raises :class:`Unreadable` and its connection is closed, so
nothing here ever has to guess. Every failure says whether the request wholly left
(``WireError.sent``): the direct path sends a GET, a listing or a plain PUT again through
boto3 either way, but a conditional PUT only if it never left; after that it is ambiguous.
"""

from __future__ import annotations

import collections
import select
import socket
import ssl
from dataclasses import dataclass

#: The largest header block read; S3 answers carry well under 2 KiB of headers.
MAX_HEAD = 64 * 1024
_RECV = 256 * 1024


class WireError(Exception):
    """The exchange failed or its answer was not one this module takes. ``sent`` is False
    when the request never wholly left this process (no connection, or its send failed):
    the store cannot have acted on it."""

    def __init__(self, message: str, *, sent: bool = True) -> None:
        super().__init__(message)
        self.sent = sent


class Unreadable(WireError):
    """An answer arrived but is not one this module takes (its framing, its status line)."""


class StaleConnection(WireError):
    """A pooled connection turned out closed before any byte of the answer arrived: the
    store dropped it while idle, so the request may be sent again on a new connection."""


@dataclass(frozen=True)
class Response:
    """A whole answer: status, headers (names in lower case) and body."""

    status: int
    headers: dict[str, str]
    body: bytes


class Connection:
    """One connection; :meth:`exchange` sends a request and reads its whole answer."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = bytearray()
        self.open = True

    def exchange(self, request: bytes) -> Response:
        """Send ``request`` (head and body) and read the answer. Closes the connection when
        the answer says so or on any error."""
        try:
            return self._exchange(request)
        except BaseException:
            self.close()
            raise

    def _exchange(self, request: bytes) -> Response:
        try:
            self.sock.sendall(request)
        except (BrokenPipeError, ConnectionResetError) as err:
            raise StaleConnection(f"send failed: {err}", sent=False) from err
        except OSError as err:
            raise WireError(f"send failed: {err}", sent=False) from err
        head = self._read_head()
        lines = head.split(b"\r\n")
        status_line = lines[0].split(b" ", 2)
        if len(status_line) < 2 or status_line[0] not in (b"HTTP/1.1", b"HTTP/1.0"):
            raise Unreadable(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
        try:
            status = int(status_line[1])
        except ValueError:
            raise Unreadable(f"bad status {status_line[1][:10]!r}") from None
        if not 200 <= status <= 599:
            raise Unreadable(f"status {status} is not a final answer")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, colon, value = line.partition(b":")
            if not colon or not name or name != name.strip():
                raise Unreadable(f"malformed header line {line[:80]!r}")
            key = name.decode("latin-1").lower()
            text = value.strip().decode("latin-1")
            if key in headers and headers[key] != text:
                if key in ("content-length", "etag"):
                    raise Unreadable(f"conflicting {key} headers")
                text = headers[key] + ", " + text
            headers[key] = text
        if "transfer-encoding" in headers:
            raise Unreadable(f"transfer encoding {headers['transfer-encoding']!r}")
        length = headers.get("content-length", "")
        if not (length.isascii() and length.isdigit()):  # "²" is a digit to str.isdigit
            raise Unreadable(f"no declared length (Content-Length {length or None})")
        body = self._read_body(int(length))
        if self.buffer:
            raise Unreadable("bytes beyond the declared body")
        if status_line[0] == b"HTTP/1.0" or "close" in headers.get("connection", "").lower():
            self.close()
        return Response(status, headers, body)

    def _recv(self, started: bool) -> None:
        try:
            chunk = self.sock.recv(_RECV)
        except ConnectionResetError as err:
            if started:
                raise WireError(f"connection reset mid-answer: {err}") from err
            raise StaleConnection(f"connection reset: {err}") from err
        except OSError as err:  # a timeout included
            raise WireError(f"receive failed: {err}") from err
        if not chunk:
            if started:
                raise WireError("connection closed mid-answer")
            raise StaleConnection("connection closed before an answer")
        self.buffer += chunk

    def _read_head(self) -> bytes:
        buffer = self.buffer
        while True:
            end = buffer.find(b"\r\n\r\n")
            if end >= 0:
                head = bytes(buffer[:end])
                del buffer[: end + 4]
                return head
            if len(buffer) > MAX_HEAD:
                raise Unreadable(f"header block over {MAX_HEAD} bytes")
            self._recv(started=bool(buffer))

    def _read_body(self, length: int) -> bytes:
        while len(self.buffer) < length:
            self._recv(started=True)
        body = bytes(self.buffer[:length])
        del self.buffer[:length]
        return body

    def looks_closed(self) -> bool:
        """Whether this idle connection can already be seen to be unusable: readable while
        no request is out means the store closed it (or wrote what nobody asked for)."""
        if self.buffer:
            return True
        try:
            poller = select.poll()  # not select(): a node's descriptors go past 1024
            poller.register(self.sock.fileno(), select.POLLIN)
            return bool(poller.poll(0))
        except (OSError, ValueError):
            return True

    def close(self) -> None:
        if self.open:
            self.open = False
            self.sock.close()


class ConnectionPool:
    """Idle connections to one ``host:port``, most recently used first, at most ``size``
    kept; :meth:`take` opens a new one when none is idle."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        connect_timeout: float,
        read_timeout: float,
        tls: ssl.SSLContext | None = None,
        size: int = 256,
    ) -> None:
        self.host = host
        self.port = port
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.tls = tls
        self.size = size
        self._idle: collections.deque[Connection] = collections.deque()

    def take(self) -> tuple[Connection, bool]:
        """A connection, and whether it was idle in the pool (and so may be stale)."""
        try:
            return self._idle.pop(), True
        except IndexError:
            return self.connect(), False

    def give(self, conn: Connection) -> None:
        """Return a connection after a whole exchange; a closed one is dropped."""
        if conn.open and len(self._idle) < self.size:
            self._idle.append(conn)
        else:
            conn.close()

    def connect(self) -> Connection:
        try:
            sock = socket.create_connection((self.host, self.port), timeout=self.connect_timeout)
        except OSError as err:
            raise WireError(
                f"could not connect to {self.host}:{self.port}: {err}", sent=False
            ) from err
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.tls is not None:
                sock = self.tls.wrap_socket(sock, server_hostname=self.host)
            sock.settimeout(self.read_timeout)
        except OSError as err:
            sock.close()
            raise WireError(
                f"could not set up the connection to {self.host}: {err}", sent=False
            ) from err
        return Connection(sock)

    def close(self) -> None:
        """Close every idle connection (other threads may be taking and giving meanwhile)."""
        while True:
            try:
                conn = self._idle.pop()
            except IndexError:
                return
            conn.close()
