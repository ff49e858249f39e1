"""The runtime's alarm, outbox and dead-letter tables in a cell's own database.

``_cellactors_alarm`` holds the cell's alarm (``set_alarm``; its named schedules are in
:mod:`~cellactors.persistence.celldb.schedule_tables`, and one wake entry covers both);
``_cellactors_outbox`` the messages of ``send`` not yet delivered;
``_cellactors_dead_letters`` the messages that could not be delivered (with why, how often it
was tried, and when), moved there out of the outbox by the delivering node, and back by an
operator's retry. All are written by the runtime inside a
transaction of the cell, so they are captured like any row and ride in the same batch as
the user's writes: an alarm set, a message sent or a letter moved exists exactly when the
transaction that did it is durable, and survives a takeover. Each is created by its first
use (that transaction is a schema change, so its batch carries a database image); cells
that never use them never have them. User SQL may read them but not write them
(:mod:`cellactors.persistence.celldb.database`).
"""

from __future__ import annotations

import secrets
import sqlite3
from dataclasses import dataclass
from typing import Any

from cellactors.core import principal
from cellactors.core.alarms import Pending, Wake, WakeState
from cellactors.core.principal import Principal
from cellactors.persistence.celldb import calls
from cellactors.persistence.celldb.schedule_tables import (
    SCHEDULE_SQL,
    SCHEDULE_TABLE,
    ScheduleTables,
)
from cellactors.persistence.celldb.socket_tables import SOCKET_SQL
from cellactors.persistence.celldb.socket_tables import table_exists as _exists

ALARM_TABLE = "_cellactors_alarm"
ALARM_SQL = (
    f"CREATE TABLE {ALARM_TABLE} ("
    "id INTEGER PRIMARY KEY CHECK (id = 1), "
    "at_ms INTEGER NOT NULL, "
    "nonce TEXT NOT NULL, "
    "failures INTEGER NOT NULL)"
)
#: The ``traceparent`` of the call that set the alarm (a row only while that call traced):
#: its fire's span links to that trace. A table of its own, so alarm rows keep their shape.
ALARM_TRACE_TABLE = "_cellactors_alarm_trace"
ALARM_TRACE_SQL = (
    f"CREATE TABLE {ALARM_TRACE_TABLE} ("
    "id INTEGER PRIMARY KEY CHECK (id = 1), "
    "traceparent TEXT NOT NULL)"
)
OUTBOX_TABLE = "_cellactors_outbox"
OUTBOX_SQL = (
    f"CREATE TABLE {OUTBOX_TABLE} ("
    "seq INTEGER PRIMARY KEY, "
    "id TEXT NOT NULL UNIQUE, "
    "txid INTEGER NOT NULL, "
    "target TEXT NOT NULL, "
    "method TEXT NOT NULL, "
    "kwargs BLOB NOT NULL, "
    "at_ms INTEGER NOT NULL)"
)
DEAD_LETTER_TABLE = "_cellactors_dead_letters"
DEAD_LETTER_SQL = (
    f"CREATE TABLE {DEAD_LETTER_TABLE} ("
    "seq INTEGER PRIMARY KEY, "
    "id TEXT NOT NULL UNIQUE, "
    "txid INTEGER NOT NULL, "
    "target TEXT NOT NULL, "
    "method TEXT NOT NULL, "
    "kwargs BLOB NOT NULL, "
    "sent_ms INTEGER NOT NULL, "
    "attempts INTEGER NOT NULL, "
    "first_failure_ms INTEGER NOT NULL, "
    "dead_ms INTEGER NOT NULL, "
    "code TEXT NOT NULL, "
    "outcome TEXT NOT NULL, "
    "reason TEXT NOT NULL)"
)
#: Every runtime table with the exact SQL that creates it.
RUNTIME_SQL = {
    calls.CALLS_TABLE: calls.CALLS_SQL,
    ALARM_TABLE: ALARM_SQL,
    ALARM_TRACE_TABLE: ALARM_TRACE_SQL,
    OUTBOX_TABLE: OUTBOX_SQL,
    DEAD_LETTER_TABLE: DEAD_LETTER_SQL,
    SCHEDULE_TABLE: SCHEDULE_SQL,
    **SOCKET_SQL,
}


def _encode_message(kwargs: dict[str, Any], caller: Principal | None, trace: str = "") -> bytes:
    """A message's stored arguments: the kwargs alone, ``[kwargs, caller]`` when it was
    sent on behalf of a caller, ``[kwargs, caller, traceparent]`` when its sender traced
    (the column keeps its type; rows written before callers or traces still read back)."""
    if trace:
        return calls.encode([kwargs, principal.encode(caller), trace])
    if caller is None:
        return calls.encode(kwargs)
    return calls.encode([kwargs, principal.encode(caller)])


def _decode_message(blob: bytes) -> tuple[dict[str, Any], Principal | None, str]:
    """The kwargs, the caller and the ``traceparent`` (empty: none) of a stored message."""
    value = calls.decode(blob)
    if isinstance(value, list) and len(value) in (2, 3):
        trace = str(value[2]) if len(value) == 3 else ""
        return value[0], principal.decode(value[1]), trace
    return value, None, ""


@dataclass(frozen=True)
class AlarmRow:
    """The cell's alarm: due at ``at_ms``, ``failures`` failed runs in a row so far."""

    at_ms: int
    nonce: str
    failures: int
    #: The ``traceparent`` of the call that set it (empty: that call did not trace).
    trace: str = ""

    @property
    def wake(self) -> Wake:
        return Wake(self.at_ms, self.nonce)


@dataclass(frozen=True)
class Message:
    """One undelivered outbox message, sent (or moved back by a retry) at ``at_ms``."""

    seq: int
    id: str
    txid: int
    target: str
    method: str
    kwargs: dict[str, Any]
    caller: Principal | None = None
    #: The W3C ``traceparent`` of the sending call's span (empty: it did not trace).
    trace: str = ""
    at_ms: int = 0

    @property
    def pending(self) -> Pending:
        return Pending(self.seq, self.target, self.txid)


@dataclass(frozen=True)
class GivenUp:
    """Why a message is given up: the last delivery's error ``code`` and ``outcome``
    (``unknown``: it may have been applied), a readable ``reason``, and the deliveries
    tried (``attempts``, the first failing at ``first_ms``)."""

    code: str
    outcome: str
    reason: str
    attempts: int
    first_ms: int


@dataclass(frozen=True)
class DeadLetter:
    """A message that could not be delivered: the message (``id`` is still its delivery's
    idempotency key), when it was sent, and why and when it was given up."""

    id: str
    txid: int
    target: str
    method: str
    kwargs: dict[str, Any]
    sent_ms: int
    attempts: int
    first_failure_ms: int
    dead_ms: int
    code: str
    outcome: str
    reason: str

    def to_dict(self) -> dict[str, Any]:
        """The letter as the operator endpoints and the command show it."""
        return {
            "id": self.id,
            "target": self.target,
            "method": self.method,
            "kwargs": self.kwargs,
            "txid": self.txid,
            "sent_ms": self.sent_ms,
            "attempts": self.attempts,
            "first_failure_ms": self.first_failure_ms,
            "dead_ms": self.dead_ms,
            "code": self.code,
            "outcome": self.outcome,
            "reason": self.reason,
        }


class RuntimeTables:
    """The alarm and the outbox of one cell, over its connection (the cell's thread only).

    ``touched`` says whether the current transaction wrote either table, so the cell
    knows when to tell the replicator the new :class:`WakeState`; the cell clears it at
    the start of every transaction."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.touched = False
        #: The cell's named schedules (their writes mark this object ``touched`` too).
        self.schedules = ScheduleTables(conn, self)

    # --- alarm --------------------------------------------------------------------------

    def alarm(self) -> AlarmRow | None:
        if not _exists(self.conn, ALARM_TABLE):
            return None
        row = self.conn.execute(
            f"SELECT at_ms, nonce, failures FROM main.{ALARM_TABLE} WHERE id = 1"
        ).fetchone()
        if row is None:
            return None
        return AlarmRow(int(row[0]), str(row[1]), int(row[2]), self._alarm_trace())

    def _alarm_trace(self) -> str:
        if not _exists(self.conn, ALARM_TRACE_TABLE):
            return ""
        row = self.conn.execute(
            f"SELECT traceparent FROM main.{ALARM_TRACE_TABLE} WHERE id = 1"
        ).fetchone()
        return "" if row is None else str(row[0])

    def set_alarm(self, at_ms: int, failures: int = 0, trace: str = "") -> AlarmRow:
        """Replace the alarm (a fresh nonce every time: a new wake entry), set by a call in
        the trace ``trace`` names (a ``traceparent``; empty: none)."""
        if not _exists(self.conn, ALARM_TABLE):
            self.conn.execute(ALARM_SQL)
        row = AlarmRow(at_ms, secrets.token_hex(8), failures, trace)
        self.conn.execute(
            f"INSERT OR REPLACE INTO main.{ALARM_TABLE} (id, at_ms, nonce, failures) "
            "VALUES (1, ?, ?, ?)",
            (row.at_ms, row.nonce, row.failures),
        )
        self._set_alarm_trace(trace)
        self.touched = True
        return row

    def _set_alarm_trace(self, trace: str) -> None:
        """Keep ``trace`` beside the alarm, or none: no row is written while nothing traces."""
        if trace:
            if not _exists(self.conn, ALARM_TRACE_TABLE):
                self.conn.execute(ALARM_TRACE_SQL)
            self.conn.execute(
                f"INSERT OR REPLACE INTO main.{ALARM_TRACE_TABLE} (id, traceparent) VALUES (1, ?)",
                (trace,),
            )
        elif _exists(self.conn, ALARM_TRACE_TABLE):
            self.conn.execute(f"DELETE FROM main.{ALARM_TRACE_TABLE}")

    def delete_alarm(self, nonce: str | None = None) -> bool:
        """Remove the alarm (only if it still has ``nonce``, when given)."""
        if not _exists(self.conn, ALARM_TABLE):
            return False
        sql = f"DELETE FROM main.{ALARM_TABLE} WHERE id = 1"
        gone = (
            self.conn.execute(sql + " AND nonce = ?", (nonce,))
            if nonce is not None
            else self.conn.execute(sql)
        ).rowcount
        if gone:
            self._set_alarm_trace("")
            self.touched = True
        return bool(gone)

    # --- outbox -------------------------------------------------------------------------

    def add_message(
        self,
        txid: int,
        target: str,
        method: str,
        kwargs: dict[str, Any],
        now_ms: int,
        caller: Principal | None = None,
        trace: str = "",
    ) -> str:
        """Record one message in the current transaction (committed as ``txid``), sent at
        ``now_ms`` (the runtime's clock), on behalf of ``caller``, in the trace ``trace``
        names (a ``traceparent``); its id is the idempotency key of its delivery."""
        if not _exists(self.conn, OUTBOX_TABLE):
            self.conn.execute(OUTBOX_SQL)
        message_id = "outbox." + secrets.token_hex(16)
        self.conn.execute(
            f"INSERT INTO main.{OUTBOX_TABLE} (id, txid, target, method, kwargs, at_ms) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (message_id, txid, target, method, _encode_message(kwargs, caller, trace), now_ms),
        )
        self.touched = True
        return message_id

    def messages(self, limit: int = 256) -> list[Message]:
        if not _exists(self.conn, OUTBOX_TABLE):
            return []
        rows = self.conn.execute(
            f"SELECT seq, id, txid, target, method, kwargs, at_ms FROM main.{OUTBOX_TABLE} "
            "ORDER BY seq LIMIT ?",
            (limit,),
        ).fetchall()
        return [
            Message(int(s), str(i), int(t), str(c), str(m), *_decode_message(bytes(k)), int(a))
            for s, i, t, c, m, k, a in rows
        ]

    def remove_messages(self, seqs: list[int]) -> None:
        if seqs and _exists(self.conn, OUTBOX_TABLE):
            self.conn.executemany(
                f"DELETE FROM main.{OUTBOX_TABLE} WHERE seq = ?", [(s,) for s in seqs]
            )
            self.touched = True

    # --- dead letters -------------------------------------------------------------------

    def bury(self, seq: int, failure: GivenUp, now_ms: int) -> bool:
        """Move outbox message ``seq`` to the dead letters (in the current transaction);
        False when it is no longer in the outbox."""
        if not _exists(self.conn, OUTBOX_TABLE):
            return False
        row = self.conn.execute(
            f"SELECT id, txid, target, method, kwargs, at_ms FROM main.{OUTBOX_TABLE} "
            "WHERE seq = ?",
            (seq,),
        ).fetchone()
        if row is None:
            return False
        if not _exists(self.conn, DEAD_LETTER_TABLE):
            self.conn.execute(DEAD_LETTER_SQL)
        self.conn.execute(
            f"INSERT INTO main.{DEAD_LETTER_TABLE} (id, txid, target, method, kwargs, sent_ms, "
            "attempts, first_failure_ms, dead_ms, code, outcome, reason) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                *row,
                failure.attempts,
                failure.first_ms,
                now_ms,
                failure.code,
                failure.outcome,
                failure.reason,
            ),
        )
        self.remove_messages([seq])
        return True

    def dead_letters(self) -> list[DeadLetter]:
        """Every dead letter, oldest burial first."""
        if not _exists(self.conn, DEAD_LETTER_TABLE):
            return []
        rows = self.conn.execute(
            "SELECT id, txid, target, method, kwargs, sent_ms, attempts, first_failure_ms, "
            f"dead_ms, code, outcome, reason FROM main.{DEAD_LETTER_TABLE} ORDER BY seq"
        ).fetchall()
        return [
            DeadLetter(
                id=str(r[0]),
                txid=int(r[1]),
                target=str(r[2]),
                method=str(r[3]),
                kwargs=_decode_message(bytes(r[4]))[0],
                sent_ms=int(r[5]),
                attempts=int(r[6]),
                first_failure_ms=int(r[7]),
                dead_ms=int(r[8]),
                code=str(r[9]),
                outcome=str(r[10]),
                reason=str(r[11]),
            )
            for r in rows
        ]

    def _letter_ids(self, ids: list[str] | None) -> list[str]:
        """The ids of ``ids`` that are dead letters (every one when None), burial order."""
        if not _exists(self.conn, DEAD_LETTER_TABLE):
            return []
        found = [
            str(r[0])
            for r in self.conn.execute(f"SELECT id FROM main.{DEAD_LETTER_TABLE} ORDER BY seq")
        ]
        if ids is None:
            return found
        wanted = set(ids)
        return [i for i in found if i in wanted]

    def revive(self, ids: list[str] | None, txid: int, now_ms: int) -> list[str]:
        """Move dead letters (``ids``, or all) back to the end of the outbox, in a
        transaction committed as ``txid``: delivered again with the same message id as
        idempotency key, their age counted from now. Returns the ids moved."""
        moved = self._letter_ids(ids)
        if not moved:
            return []
        if not _exists(self.conn, OUTBOX_TABLE):
            self.conn.execute(OUTBOX_SQL)
        now = now_ms
        for letter in moved:
            self.conn.execute(
                f"INSERT INTO main.{OUTBOX_TABLE} (id, txid, target, method, kwargs, at_ms) "
                f"SELECT id, ?, target, method, kwargs, ? FROM main.{DEAD_LETTER_TABLE} "
                "WHERE id = ?",
                (txid, now, letter),
            )
            self.conn.execute(f"DELETE FROM main.{DEAD_LETTER_TABLE} WHERE id = ?", (letter,))
        self.touched = True
        return moved

    def purge(self, ids: list[str] | None) -> list[str]:
        """Delete dead letters (``ids``, or all) for good. Returns the ids deleted."""
        gone = self._letter_ids(ids)
        if gone:
            self.conn.executemany(
                f"DELETE FROM main.{DEAD_LETTER_TABLE} WHERE id = ?", [(i,) for i in gone]
            )
        return gone

    def outbox_pending(self) -> bool:
        if not _exists(self.conn, OUTBOX_TABLE):
            return False
        found = self.conn.execute(f"SELECT 1 FROM main.{OUTBOX_TABLE} LIMIT 1").fetchone()
        return found is not None

    def state(self) -> WakeState:
        """What the wake entries must mirror now: one entry for whichever of the alarm and
        the schedules runs first (however many schedules there are), and the outbox's."""
        alarm = self.alarm()
        first = self.schedules.first()
        wakes = [w.wake for w in (alarm, first) if w is not None]
        return WakeState(min(wakes) if wakes else None, self.outbox_pending())
