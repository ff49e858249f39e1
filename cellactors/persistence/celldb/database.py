"""A cell's local SQLite database: one transaction per call, with exact change capture.

The runtime owns transactions. User code gets a sqlite-utils ``Database`` over a connection
whose ``commit``/``rollback``/context manager are inert, so library helpers that wrap their
work in ``with conn:`` cannot commit half a call. An authorizer refuses what capture could
not replicate (virtual tables, ATTACH), explicit transaction control, and writes to the
runtime's own tables (:mod:`cellactors.persistence.celldb.calls`), with a clear error.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal, TypeVar

import sqlite_utils

from cellactors.core.storage import storage_fault_reason
from cellactors.core.txn import Txn
from cellactors.errors import NodeStorageFault, Refused, TransactionLost
from cellactors.persistence import files
from cellactors.persistence.celldb import authorizer, capture
from cellactors.persistence.celldb.calls import CallLog
from cellactors.persistence.celldb.runtime_tables import RuntimeTables
from cellactors.persistence.celldb.socket_tables import SocketTables

T = TypeVar("T")

_INTERRUPT_STEPS = 1000


def _interrupter(conn: sqlite3.Connection, at: float | None) -> list[bool] | None:
    """Have SQLite interrupt every statement of ``conn`` once ``time.perf_counter()`` passes
    ``at``; the returned flag (a one-item list) says whether it did. None without ``at``."""
    if at is None:
        return None
    fired = [False]

    def handler() -> int:
        if time.perf_counter() > at:
            fired[0] = True
            return 1
        return 0

    conn.set_progress_handler(handler, _INTERRUPT_STEPS)
    return fired


class CellConnection(sqlite3.Connection):
    """A connection whose transaction methods are inert for user code."""

    def commit(self) -> None:
        """Inert: the runtime commits when the call returns."""

    def rollback(self) -> None:
        """Inert: the runtime rolls back when the call raises."""

    def __enter__(self) -> CellConnection:
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        return False


class ReadInterrupted(Exception):
    """A read-only call on the serving event loop ran past its budget and was interrupted
    (rolled back, no effect): it is sent again off the loop, never answered as it is."""


class CellDatabase:
    """The SQLite file of one cell and the transaction discipline around it."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if str(path) != ":memory:":
            # 0600 (SQLite gives its WAL and SHM the database's mode). A directory that
            # takes no file fails just below, in SQLite's words, as a storage fault.
            with contextlib.suppress(OSError):
                files.create_private_file(self.path)
        self.conn = self._connect()
        self.db = sqlite_utils.Database(self.conn)
        # sqlite-utils probes upsert support by creating and dropping a table in the user's
        # database, which would look like a schema change; every supported SQLite has it.
        self.db._supports_on_conflict = True
        self._refusal: str | None = None
        self._runtime_writing = False
        self._header_set = False  # user code set a header pragma in this transaction
        #: True while a read-only method's code runs: the authorizer refuses its writes, and
        #: the cell refuses its alarms, messages and calls to other cells.
        self.read_only = False
        #: Called first by :meth:`close`: the cell's gate, which waits for a call running in
        #: another thread, so that no SQL ever runs on a closed connection.
        self.before_close: Callable[[], None] | None = None
        self.calls = CallLog(self.conn)
        self.tables = RuntimeTables(self.conn)
        self.sockets = SocketTables(self.conn)
        self.trims = 0
        #: The first fault of the node's storage met on this file.
        self.fault: NodeStorageFault | None = None
        #: The file's state is not trusted any more (a rollback or commit failed, or the
        #: transaction was lost under the method): nothing runs on it again, and the node
        #: discards it; the cell is restored from the bucket, which never saw any of it.
        self.broken = False
        #: Called with each storage fault met on this file (the node counts it and gives
        #: the cell up), and when the file turns broken (the node gives the cell up).
        self.on_fault: Callable[[NodeStorageFault], None] | None = None
        self.on_broken: Callable[[], None] | None = None
        self._last_fault: NodeStorageFault | None = None
        self._after_change()

    def _connect(self) -> CellConnection:
        conn = sqlite3.connect(
            self.path, factory=CellConnection, isolation_level=None, check_same_thread=False
        )
        # The bucket is the durability root; the local file is a cache of it, reused only by
        # the process that wrote it. So no WAL: the rollback journal and temp tables stay in
        # memory, and an active cell holds one file descriptor.
        conn.execute("PRAGMA journal_mode = MEMORY")
        conn.execute("PRAGMA temp_store = MEMORY")
        conn.execute("PRAGMA synchronous = OFF")
        return conn

    def _after_change(self) -> None:
        self.calls.forget()
        self.shapes = capture.install(self.conn)
        self.schema = capture.schema_version(self.conn)
        self.sequence = capture.read_sequence(self.conn)
        self.header = capture.read_header(self.conn)

    def storage_fault(self, err: BaseException, *, broken: bool = False) -> NodeStorageFault | None:
        """``err`` as the fault of the node's storage it is (recorded and reported), or None
        when it is not one. ``broken``: the file's state cannot be trusted after it."""
        reason = storage_fault_reason(err)
        if reason is None:
            return None
        fault = NodeStorageFault(
            f"this node's local storage failed ({reason}); nothing of the call was applied",
            reason,
        )
        self.fault = self.fault or fault
        if self.on_fault is not None:
            self.on_fault(fault)
        if broken:
            self.mark_broken()
        return fault

    def mark_broken(self) -> None:
        """The file's state is not trusted any more (see :attr:`broken`)."""
        if self.broken:
            return
        self.broken = True
        if self.on_broken is not None:
            self.on_broken()

    def check_usable(self) -> None:
        """Raise :class:`~cellactors.errors.NodeStorageFault` if the file is broken: the
        runtime reads nothing from it either (a keyed call's record, the outbox)."""
        if self.broken:
            cause = f" ({self.fault.reason})" if self.fault is not None else ""
            raise self._raising(
                NodeStorageFault(
                    f"this cell's local file is no longer trusted{cause}; the node gives the "
                    "cell up, to be restored from the bucket: nothing of the call was applied"
                )
            )

    def _raising(self, fault: NodeStorageFault) -> NodeStorageFault:
        self._last_fault = fault
        return fault

    def raised_here(self, err: BaseException) -> bool:
        """``err`` is the storage fault this database raised last (not one that a call to
        another cell raised into the method)."""
        return err is self._last_fault

    @contextlib.contextmanager
    def runtime_writes(self) -> Iterator[RuntimeTables]:
        """The runtime's own writes (alarm, outbox) from inside a user call: the authorizer
        lets them through. They run in the cell's thread, with no user code in between."""
        self._runtime_writing = True
        try:
            yield self.tables
        finally:
            self._runtime_writing = False

    def _authorize(self, action: int, arg1: str | None, arg2: str | None, *_rest: object) -> int:
        if self._runtime_writing:
            return sqlite3.SQLITE_OK
        reason, header = authorizer.decide(action, arg1, arg2, read_only=self.read_only)
        self._header_set = self._header_set or header
        if reason is None:
            return sqlite3.SQLITE_OK
        self._refusal = reason
        return sqlite3.SQLITE_DENY

    def run(
        self,
        fn: Callable[[], T],
        check: Callable[[T], None] | None = None,
        on_write: Callable[[T], None] | None = None,
        *,
        read_only: bool = False,
        interrupt_at: float | None = None,
    ) -> tuple[T, capture.TxnChanges]:
        """Run ``fn`` as one transaction; commit if it returns (and ``check`` accepts the
        result), roll back and re-raise if anything raises.

        ``interrupt_at`` (a ``time.perf_counter()``, read-only transactions only): SQLite
        interrupts the method's statements from then on, and the call is rolled back with
        :class:`ReadInterrupted` even if the method caught the interruption (its result
        may be incomplete).

        ``on_write`` is the runtime's own work in the same transaction (recording the call's
        key, collecting old keys): it runs after ``check``, without the authorizer, and only
        when ``fn`` changed something, so a read-only call stays read-only.

        ``read_only``: ``fn`` may change nothing. The authorizer refuses every statement
        that would write or set a pragma, so the transaction takes no write lock; a change
        that got past it anyway (the method removed the authorizer) still fails the call
        (rolled back, :class:`Refused`).

        An error of the node's storage, in any statement (the method's, the runtime's, the
        COMMIT) is raised as :class:`~cellactors.errors.NodeStorageFault` once the
        transaction is rolled back: nothing of it is kept or shipped. When the rollback or
        the COMMIT failed, or the method wrote on after SQLite had rolled its transaction
        back, the file is marked :attr:`broken` and every later call is refused the same
        way."""
        self.check_usable()
        conn = self.conn
        self._refusal = None
        stage = "begin"
        try:
            conn.execute("BEGIN" if read_only else "BEGIN IMMEDIATE")
            stage = "method"
            self._header_set = False
            before = conn.total_changes
            self.read_only = read_only
            conn.set_authorizer(self._authorize)
            stopped = _interrupter(conn, interrupt_at) if read_only else None
            try:
                result = fn()
            finally:
                authorizer.clear(conn)
                self.read_only = False
                if stopped is not None:
                    conn.set_progress_handler(None, 0)
            if stopped is not None and stopped[0]:
                raise ReadInterrupted("the read ran past its budget on the event loop")
            stage = "runtime"
            if not conn.in_transaction:
                raise TransactionLost(
                    "the transaction was rolled back under the method (an ON CONFLICT "
                    "ROLLBACK, a RAISE(ROLLBACK), or an error it caught): nothing was kept"
                )
            if self._refusal is not None:
                raise Refused(f"refused: {self._refusal}")
            seen = capture.schema_version(conn)
            # A header pragma (user_version) changes no schema, but only an image carries it.
            header = capture.read_header(conn) if self._header_set else self.header
            header_changed = header != self.header
            user_changed_schema = seen != self.schema or header_changed
            if read_only and (user_changed_schema or conn.total_changes != before):
                # Past the authorizer (the method removed it): refused all the same.
                raise Refused("a read-only method may not write: its changes were rolled back")
            if not user_changed_schema and conn.total_changes == before:
                # Read-only: no row written (capture triggers and AUTOINCREMENT counters
                # count as changes too) and no schema change: nothing to capture or ship.
                if check is not None:
                    check(result)
                stage = "commit"
                conn.execute("COMMIT")
                return result, capture.TxnChanges(schema_changed=False)
            if user_changed_schema:
                authorizer.check_reserved(conn)
            if check is not None:
                check(result)
            # The runtime's writes never move the AUTOINCREMENT counters, and the table that
            # holds them can only appear with a schema change.
            sequence = (
                capture.read_sequence(conn)
                if user_changed_schema or self.sequence is not None
                else None
            )
            version = seen
            if on_write is not None and (
                user_changed_schema or sequence != self.sequence or capture.pending(conn)
            ):
                on_write(result)
                version = capture.schema_version(conn)  # the runtime may create its tables
            changed = version != self.schema
            previous = self.shapes
            if changed:
                self.shapes = capture.install(conn)  # raises for unsupported tables
            changes = capture.collect(conn, self.shapes, changed or header_changed, previous)
            if sequence != self.sequence:
                changes.sequence = sequence
            stage = "commit"
            conn.execute("COMMIT")
        except BaseException as err:
            lost = stage in ("method", "runtime") and not conn.in_transaction
            intact = self._roll_back()
            self.calls.forget()  # the runtime's writes (if any) were rolled back too
            # Statements the method ran past a lost transaction wrote outside any; a failed
            # COMMIT may have written part of its pages (the journal is in memory).
            suspect = not intact or (lost and self._wrote_outside())
            fault = self.storage_fault(err, broken=suspect or stage == "commit")
            if fault is not None:
                raise self._raising(fault) from err
            if suspect:
                self.mark_broken()
            if self._refusal is not None and isinstance(err, sqlite3.DatabaseError):
                raise Refused(f"refused: {self._refusal}") from err
            late = interrupt_at is not None and time.perf_counter() > interrupt_at
            if stage == "method" and late and not isinstance(err, ReadInterrupted):
                raise ReadInterrupted("the read ran past its budget on the event loop") from err
            raise
        self.schema = version  # a COMMIT does not move it, nor do temp capture triggers
        self.sequence = sequence
        self.header = header
        return result, changes

    def _wrote_outside(self) -> bool:
        """After SQLite rolled a transaction back under the method: whether a statement
        since changed the file (each ran in a transaction of its own): a captured row, the
        schema or the header. Unknown counts as yes."""
        try:
            return (
                capture.pending(self.conn)
                or capture.schema_version(self.conn) != self.schema
                or capture.read_header(self.conn) != self.header
            )
        except sqlite3.Error:
            return True

    def _roll_back(self) -> bool:
        """Roll back the open transaction, if any: False when the rollback itself failed
        (the file's state is then unknown)."""
        if not self.conn.in_transaction:
            return True
        try:
            self.conn.execute("ROLLBACK")
        except sqlite3.Error:
            return False
        return True

    def trim(self) -> None:
        """Hand the connection's page caches back to the allocator (between transactions):
        an idle cell keeps its file and connection but not the cached pages."""
        self.conn.execute("PRAGMA shrink_memory")
        self.trims += 1

    def image(self) -> bytes:
        """The whole database as bytes (for schema-changing transactions and snapshots)."""
        return capture.database_image(self.conn)

    def load_image(self, image: bytes) -> None:
        """Replace the whole database with ``image``."""
        with image_source(image) as src:
            self._replace_from(src)

    def clear(self) -> None:
        """Empty the database, as a new file is (a restore that plans again starts over)."""
        src = sqlite3.connect(":memory:")
        try:
            self._replace_from(src)
        finally:
            src.close()

    def _replace_from(self, src: sqlite3.Connection) -> None:
        capture.uninstall(self.conn)  # no temp trigger may outlive the tables it watches
        src.backup(self.conn)
        self._after_change()

    def apply(self, txn: Txn) -> None:
        """Replay one replicated transaction."""
        if txn.image is not None:
            self.load_image(txn.image)
            return
        conn = self.conn
        self.calls.forget()
        conn.execute("BEGIN IMMEDIATE")
        try:
            with capture.without_user_triggers(conn):
                capture.apply_rows(conn, txn.rows, txn.columns, txn.sequence)
            conn.execute(f"DELETE FROM {capture.CHANGES_TABLE}")
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        if txn.sequence is not None:
            self.sequence = txn.sequence

    def close(self) -> None:
        if self.before_close is not None:
            self.before_close()
        self.conn.close()

    def discard(self) -> None:
        """Close and delete the local copy (after a reset). A file the failing storage will
        not let go of (a read-only file system) stays behind: nothing reuses a discarded
        file, and the next activation at that epoch, or the node's next start, removes it."""
        self.close()
        with contextlib.suppress(OSError):
            remove_db_files(self.path)


@contextlib.contextmanager
def image_source(image: bytes) -> Iterator[sqlite3.Connection]:
    """A connection reading the database ``image``: in memory where SQLite can deserialize
    (Python 3.11+; half the CPU of a restore's image load), else through a temporary file."""
    if sys.version_info >= (3, 11) and hasattr(sqlite3.Connection, "deserialize"):
        src = sqlite3.connect(":memory:")
        try:
            src.deserialize(image)
            yield src
        finally:
            src.close()
        return
    fd, tmp = tempfile.mkstemp(suffix=".db")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(image)
        src = sqlite3.connect(tmp)
        try:
            yield src
        finally:
            src.close()
    finally:
        os.unlink(tmp)


def remove_db_files(path: Path) -> None:
    """Delete a SQLite file with its WAL and shared-memory companions."""
    for suffix in ("", "-wal", "-shm"):
        Path(str(path) + suffix).unlink(missing_ok=True)


def to_txn(
    txid: int,
    changes: capture.TxnChanges,
    image: bytes | None,
    ts_ms: int,
    rollback: tuple[int, int] | None = None,
) -> Txn:
    """Build the replicated form of a committed transaction."""
    return Txn(
        txid=txid,
        rows=changes.rows,  # with an image, for the change feed only (replay loads the image)
        columns=changes.columns,
        sequence=changes.sequence,
        image=image,
        ts_ms=ts_ms,
        rollback=rollback,
    )


def dump(db: sqlite_utils.Database) -> dict[str, Any]:
    """Schema and every row of every table (``sqlite_sequence`` included), for comparisons."""
    conn = db.conn
    schema = sorted(
        (str(t), str(n), str(s))
        for t, n, s in conn.execute(
            "SELECT type, name, sql FROM main.sqlite_master WHERE sql IS NOT NULL"
        )
    )
    tables: dict[str, Any] = {}
    for (name,) in conn.execute("SELECT name FROM main.sqlite_master WHERE type='table'"):
        shape_sql = conn.execute(
            "SELECT sql FROM main.sqlite_master WHERE name=?", (name,)
        ).fetchone()[0]
        rowid = (
            capture.table_shape(conn, name, shape_sql).rowid if name != "sqlite_sequence" else True
        )
        cols = "rowid, *" if rowid else "*"
        rows = conn.execute(f"SELECT {cols} FROM main.{capture.quote(name)}").fetchall()
        tables[name] = sorted(rows, key=repr)
    return {"schema": schema, "tables": tables}
