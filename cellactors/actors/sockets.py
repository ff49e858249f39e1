"""Sockets as a cell sees them: :class:`Connection`, and the runtime's socket events.

A holder node turns what happens on a socket into calls of the cell's reserved method
:data:`SOCKET_METHOD`, routed and forwarded like any call (so they run one at a time with
the cell's calls, each as one transaction, and a message retried after an ambiguous failure
runs once, by its idempotency key). :func:`handle` runs one such event inside that
transaction: it keeps ``_cellactors_sockets`` up to date and calls the cell's
``on_connect``, ``on_message`` or ``on_close``; a sync or a resume answers with the retained
pushes a holder may have missed (:mod:`cellactors.core.sockets`).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from cellactors.core import sockets
from cellactors.core.principal import Principal
from cellactors.core.sockets import Holder, Push
from cellactors.errors import BadRequest, CallError, Forbidden, SocketGone, SocketMissed
from cellactors.persistence.celldb import calls
from cellactors.persistence.celldb.socket_tables import SocketRow, SocketTables, target_of

#: The reserved method socket events call (never exposed; a peer's signed forward only).
SOCKET_METHOD = "_cellactors_socket"
#: Opens the cell's socket tables for the runtime's writes (the cell's authorizer lets
#: them through), inside the running transaction; user code never runs under it.
Writes = Callable[[], AbstractContextManager[SocketTables]]
#: The most an attachment may weigh, encoded.
MAX_ATTACHMENT_BYTES = 2048


class SocketCell(Protocol):
    """What :func:`handle` needs of the cell."""

    cell_id: str

    @property
    def caller(self) -> Principal | None: ...
    def on_connect(self, conn: Connection) -> None: ...
    def on_message(self, conn: Connection, data: str | bytes) -> None: ...
    def on_close(self, conn: Connection, code: int, reason: str) -> None: ...


class Connection:
    """One socket open on the cell, as its handlers see it: send to it, close it, tag it,
    keep a small attachment with it. Use it only inside the cell's methods (its writes are
    rows of the running transaction)."""

    __slots__ = ("_row", "_writes")

    def __init__(self, row: SocketRow, writes: Writes) -> None:
        self._row = row
        self._writes = writes

    @property
    def id(self) -> str:
        return self._row.id

    @property
    def tags(self) -> tuple[str, ...]:
        return self._row.tags

    @property
    def caller(self) -> Principal | None:
        """Who opened the socket (None: an anonymous caller, or authentication is off)."""
        return self._row.caller

    @property
    def kind(self) -> str:
        """``websocket``, or ``events`` for a server-sent event stream (it sends nothing)."""
        return self._row.kind

    @property
    def attachment(self) -> Any:
        """A small value the runtime keeps with the socket (None until set)."""
        return self._row.attachment

    @attachment.setter
    def attachment(self, value: Any) -> None:
        try:
            size = len(calls.encode(value))
        except (TypeError, ValueError, OverflowError) as err:
            raise BadRequest(f"an attachment must be msgpack-serializable: {err}") from err
        if size > MAX_ATTACHMENT_BYTES:
            raise BadRequest(f"an attachment holds at most {MAX_ATTACHMENT_BYTES} bytes encoded")
        with self._writes() as tables:
            self._row.attachment = value
            tables.update(self._row)

    def set_tags(self, *tags: str) -> None:
        """Replace the socket's tags (``broadcast(..., tag=)`` and ``connections(tag=)``)."""
        checked = sockets.check_tags(list(tags))
        with self._writes() as tables:
            self._row.tags = checked
            tables.update(self._row)

    def send(self, data: str | bytes) -> None:
        """Send ``data`` (a text or a binary frame) once this transaction is durable."""
        with self._writes() as tables:
            push(tables, target_of(conn=self.id), data)

    def close(self, code: int = sockets.CLOSE_NORMAL, reason: str = "") -> None:
        """Close the socket once this transaction is durable (after what was sent before);
        ``on_close`` does not run for it."""
        if not (code == sockets.CLOSE_NORMAL or 3000 <= code <= 4999):
            raise ValueError("a cell closes a socket with 1000 or a code of 3000 to 4999")
        with self._writes() as tables:
            tables.push(target_of(conn=self.id), sockets.CLOSE, sockets.close_reason(reason), code)
            tables.remove(self.id)

    def __repr__(self) -> str:
        return f"<Connection {self.id} tags={list(self.tags)}>"


def push(tables: SocketTables, target: str, data: str | bytes) -> int:
    """Record a push of ``data`` to ``target``: how many sockets it goes to."""
    if isinstance(data, str | bytes | bytearray | memoryview) and (
        len(data) > sockets.MAX_PUSH_BYTES
    ):
        raise ValueError(f"a push is at most {sockets.MAX_PUSH_BYTES} bytes (or characters)")
    if isinstance(data, bytes | bytearray | memoryview):
        sent = tables.push(target, sockets.BYTES, bytes(data))
    elif isinstance(data, str):
        sent = tables.push(target, sockets.TEXT, data)
    else:
        raise TypeError(f"a socket takes str or bytes, not {type(data).__name__}")
    return 0 if sent is None else len(sent.conns)


def _wire(pushes: list[Push]) -> list[list[Any]]:
    return [[p.seq, list(p.conns), p.kind, p.data, p.code] for p in pushes]


def from_wire(items: Any) -> list[Push]:
    """The pushes a sync or a delivery carries."""
    return [
        Push(int(s), tuple(str(c) for c in cs), str(k), d, int(code)) for s, cs, k, d, code in items
    ]


@dataclass(frozen=True)
class Here:
    """The activation a socket event runs in: the cell, its epoch, the owning node (whom
    holders watch) and how to tell that node a holder synced up to a push."""

    cell_id: str
    epoch: int
    owner: Holder
    synced: Callable[[str, int, str, int], None]


def handle(
    cell: SocketCell,
    writes: Writes,
    here: Here,
    event: str,
    fields: dict[str, Any],
    now_ms: int,
) -> Any:
    """Run socket event ``event`` in the running transaction (see the module). The cell's
    handlers run outside ``writes``: their SQL meets the cell's authorizer as ever."""
    conn_id = str(fields.get("conn", ""))
    epoch = here.epoch

    def connection(row: SocketRow) -> Connection:
        return Connection(row, writes)

    if event == "connect":
        try:
            tags = sockets.check_tags(fields.get("tags") or [])
        except ValueError as err:
            raise refusal(BadRequest(str(err))) from None
        row = SocketRow(
            conn_id,
            Holder.from_wire(fields["holder"]),
            tags,
            None,
            cell.caller,
            str(fields.get("kind", "websocket")),
            now_ms,
        )
        with writes() as tables:
            head = row.since = tables.head()
            tables.add(row)
        cell.on_connect(connection(row))
        return {"epoch": epoch, "head": head, "owner": here.owner.to_wire()}
    if event == "message":
        with writes() as tables:
            row = _held(tables, conn_id, cell.caller)
        cell.on_message(connection(row), fields["data"])
        return None
    if event == "close":
        holder = Holder.from_wire(fields["holder"])
        with writes() as tables:
            closed = tables.get(conn_id)
            if closed is not None and closed.holder != holder:
                closed = None  # resumed on another node since: that socket is open
            if closed is not None:
                tables.remove(conn_id)
        if closed is not None:
            cell.on_close(connection(closed), int(fields["code"]), str(fields.get("reason", "")))
        return None
    if event in ("sync", "resume"):
        holder = Holder.from_wire(fields["holder"])
        with writes() as tables:
            if event == "sync":
                cursors = {str(k): int(v) for k, v in dict(fields["cursors"]).items()}
            else:
                row = _held(tables, conn_id, cell.caller)
                row.holder = holder
                tables.update(row)
                cursors = {conn_id: int(fields["after"])}
            # A resume answers for its socket only: the holder's other sockets of the
            # cell may still be owed earlier pushes, so it does not count as their sync.
            return _catch_up(tables, here, holder, cursors, event == "sync")
    if event == "lost":
        holder = Holder.from_wire(fields["holder"])
        with writes() as tables:
            rows = [row for row in tables.held_by(holder.node) if row.holder == holder]
            for row in rows:
                tables.remove(row.id)
        for row in rows:
            cell.on_close(
                connection(row), sockets.CLOSE_HOLDER_LOST, "the node holding it was lost"
            )
        return None
    raise refusal(BadRequest(f"no socket event {event!r}"))


def refusal(err: CallError) -> CallError:
    """``err`` marked as the runtime's own refusal of a socket event (answered as it is,
    not as a failure of the cell's code)."""
    err.socket_refusal = True  # type: ignore[attr-defined]
    return err


def is_refusal(err: BaseException) -> bool:
    return getattr(err, "socket_refusal", False) is True


def _held(tables: SocketTables, conn_id: str, caller: Principal | None) -> SocketRow:
    row = tables.get(conn_id)
    if row is None:
        raise refusal(SocketGone(f"socket {conn_id} is not open on this cell"))
    if row.caller != caller:
        raise refusal(Forbidden(f"socket {conn_id} was opened by another caller"))
    return row


def _catch_up(
    tables: SocketTables, here: Here, holder: Holder, cursors: dict[str, int], synced: bool
) -> dict[str, Any]:
    """What a holder missed: the retained pushes after each socket's cursor; the sockets
    the cell no longer has there (``gone``), or whose cursor is older than what it keeps
    (``missed``)."""
    floor = tables.floor()
    live, gone, missed = [], [], []
    for conn_id, cursor in cursors.items():
        row = tables.get(conn_id)
        if row is None or row.holder != holder:
            gone.append(conn_id)
        elif sockets.missed(floor, cursor):
            missed.append(conn_id)
        else:
            live.append(row)
    after = min((cursors[c] for c in (*(r.id for r in live), *gone)), default=0)
    pushes = [
        Push(p.seq, tuple(c for c in p.conns if p.seq > cursors[c]), p.kind, p.data, p.code)
        for p in tables.pushes_for(live, after, tuple(gone))  # a gone one: its close, if any
    ]
    head = tables.head()
    if synced:
        here.synced(here.cell_id, here.epoch, holder.node, head)
    return {
        "epoch": here.epoch,
        "head": head,
        "owner": here.owner.to_wire(),
        "pushes": _wire([p for p in pushes if p.conns]),
        "gone": gone,
        "missed": missed,
    }


def check_resumable(answer: dict[str, Any], conn_id: str) -> None:
    """Raise what a resume's answer says about its socket (gone, or missed pushes)."""
    if conn_id in answer.get("gone", ()):
        raise SocketGone(f"socket {conn_id} is not open on this cell")
    if conn_id in answer.get("missed", ()):
        raise SocketMissed(f"socket {conn_id} missed pushes the cell no longer keeps")


__all__ = [
    "SOCKET_METHOD",
    "Connection",
    "SocketCell",
    "check_resumable",
    "from_wire",
    "handle",
    "push",
]
