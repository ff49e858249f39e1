"""A WebSocket to one cell from Python, that survives the node holding it going away.

:meth:`cellactors.client.Client.connect` opens one on the first of the client's nodes that
takes it. Frames are numbered (the ``cellactors.v1`` subprotocol); when the socket drops
for any reason but the cell's or the client's own close, it is resumed on the next node
(``?resume=<id>&after=<last number seen>``) for up to ``resume_for`` seconds, and frames
already seen are dropped, so :meth:`CellSocket.recv` yields each push once, in order.
A message :meth:`CellSocket.send` wrote just before a drop may or may not have reached the
cell (as with any request without an answer).
"""

from __future__ import annotations

import inspect
import json
import time
from collections.abc import Iterator, Sequence
from typing import Any
from urllib.parse import quote, urlencode

from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect
from websockets.typing import Subprotocol

from cellactors.core import sockets

#: Close codes after which resuming makes no sense: the cell or the client closed it, or it
#: is gone, refused, or lost pushes.
FINAL_CODES = frozenset(
    {
        sockets.CLOSE_NORMAL,
        sockets.CLOSE_NOT_UTF8,
        sockets.CLOSE_TOO_BIG,
        sockets.CLOSE_FAILED,
        sockets.CLOSE_REFUSED,
        sockets.CLOSE_GONE,
        sockets.CLOSE_SLOW,
        sockets.CLOSE_MISSED,
    }
)
_FINAL_CELL_CODES = range(3000, 4000)  # codes a cell closes with: its own, final


#: websockets 17.1 (Python 3.11 and later) warns when a connection is opened other than as
#: a context manager unless asked for the former behaviour; earlier versions have no flag.
_HELD = {"legacy": True} if "legacy" in inspect.signature(connect).parameters else {}
_connect: Any = connect  # its overloads cannot say which a flag decided at import picks


def held_connection(url: str, **options: Any) -> ClientConnection:
    """A WebSocket connection opened now and held past this call (closed by its owner),
    with any version of ``websockets`` the project supports."""
    opened: ClientConnection = _connect(url, **options, **_HELD)
    return opened


class SocketClosed(Exception):
    """The socket is closed for good: ``code`` and ``reason`` say why."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(f"socket closed ({code}): {reason}")
        self.code = code
        self.reason = reason


class CellSocket:
    """One WebSocket to a cell (see the module). Use it from one thread."""

    def __init__(
        self,
        urls: Sequence[str],
        cls_name: str,
        name: str,
        *,
        tags: Sequence[str] = (),
        token: str | None = None,
        resume_for: float = 30.0,
        open_timeout: float = 10.0,
    ) -> None:
        self.urls = [u.rstrip("/") for u in urls]
        self.path = f"/cells/{quote(cls_name, safe='')}/{quote(name, safe='')}/ws"
        self.tags = list(tags)
        self.token = token
        self.resume_for = resume_for
        self.open_timeout = open_timeout
        #: The socket's id (it names the socket to resume) and the last frame number seen.
        self.id = ""
        self.seq = 0
        self.resumes = 0
        self._next = 0
        self._ws: ClientConnection | None = None
        self._closed: SocketClosed | None = None
        self._open(resume=False)

    def _url(self, base: str, resume: bool) -> str:
        ws_base = "ws" + base[len("http") :] if base.startswith("http") else base
        query: list[tuple[str, str]] = [("tag", t) for t in self.tags]
        if resume:
            query = [("resume", self.id), ("after", str(self.seq))]
        return ws_base + self.path + (f"?{urlencode(query)}" if query else "")

    def _open(self, resume: bool) -> None:
        protocols = [sockets.SUBPROTOCOL]
        if self.token:
            protocols.append(f"cellactors.bearer.{self.token}")
        deadline = time.monotonic() + (self.resume_for if resume else self.open_timeout)
        last: BaseException | None = None
        while time.monotonic() < deadline or last is None:
            base = self.urls[self._next % len(self.urls)]
            self._next += 1
            try:
                ws = held_connection(
                    self._url(base, resume),
                    subprotocols=[Subprotocol(p) for p in protocols],
                    open_timeout=self.open_timeout,
                    max_size=None,
                )
                hello = json.loads(ws.recv(timeout=self.open_timeout))
            except ConnectionClosed as err:
                self._final(err)
                last = err
            except (OSError, InvalidStatus, TimeoutError) as err:
                last = err
                time.sleep(0.2)
                continue
            else:
                self.id = str(hello["conn"])
                if not resume:
                    self.seq = int(hello["seq"])
                self._ws = ws
                return
        raise SocketClosed(sockets.CLOSE_TRY_LATER, f"no node took the socket: {last!r}")

    def _final(self, err: ConnectionClosed) -> None:
        """Raise when ``err`` closed the socket for good."""
        frame = err.rcvd
        if frame is None:
            return
        if frame.code in FINAL_CODES or frame.code in _FINAL_CELL_CODES:
            self._closed = SocketClosed(frame.code, frame.reason)
            raise self._closed

    def _resume(self, err: ConnectionClosed) -> None:
        self._ws = None
        self._final(err)
        self.resumes += 1
        self._open(resume=True)

    def send(self, data: str | bytes) -> None:
        """Send a message to the cell (its ``on_message``), resuming first if it dropped."""
        while True:
            ws = self._connection()
            try:
                ws.send(data)
                return
            except ConnectionClosed as err:
                self._resume(err)

    def _connection(self) -> ClientConnection:
        """The open connection, resumed first if it dropped; raises once closed for good."""
        while True:
            if self._closed is not None:
                raise self._closed
            if self._ws is not None:
                return self._ws
            self._open(resume=True)

    def recv(self, timeout: float | None = None) -> str | bytes:
        """The next push (text as ``str``, binary as ``bytes``); ``TimeoutError`` when none
        came within ``timeout``; :class:`SocketClosed` once it is closed for good."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            ws = self._connection()
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                frame = ws.recv(timeout=left)
            except ConnectionClosed as err:
                self._resume(err)
                continue
            seq, data = _unframe(frame)
            if seq <= self.seq:
                continue  # seen before a resume
            self.seq = seq
            return data

    def __iter__(self) -> Iterator[str | bytes]:
        while True:
            try:
                yield self.recv()
            except SocketClosed:
                return

    def close(self, code: int = sockets.CLOSE_NORMAL, reason: str = "") -> None:
        """Close the socket (the cell's ``on_close`` runs)."""
        ws, self._ws = self._ws, None
        self._closed = SocketClosed(code, reason or "closed by the client")
        if ws is not None:
            ws.close(code, reason)

    def __enter__(self) -> CellSocket:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _unframe(frame: str | bytes) -> tuple[int, str | bytes]:
    """A numbered frame's number and data (``cellactors.v1``)."""
    if isinstance(frame, bytes):
        return int.from_bytes(frame[:8], "big"), frame[8:]
    value = json.loads(frame)
    return int(value["seq"]), str(value["text"])


__all__ = ["CellSocket", "SocketClosed", "held_connection"]
