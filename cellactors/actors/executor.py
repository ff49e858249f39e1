"""The executor of one cell: it runs the cell's messages, each as one transaction of the
cell's database, and holds every answer until the replicator proves it durable.

A call runs the user's method (answered from its record when its idempotency key was seen,
recorded with it when it writes); an alarm's fire runs ``on_alarm`` when due and records a
retry when it fails; the runtime's own edits (the outbox, dead letters) run on the runtime
tables; a snapshot image and the outbox are read outside any call. A committed transaction
goes to the replicator with the wake state it changed. The user's class
(:class:`~cellactors.actors.cell.CellActor`) holds none of this: it is what users write, and
this is what runs it.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import time
from collections.abc import Callable
from typing import Any, ClassVar, Protocol, TypeVar

import pykka

from cellactors.actors.cell_runtime import (
    CellRuntime,
    bound_arguments,
    cells_log,
    encode_result,
    run_result_check,
    user_failure,
)
from cellactors.actors.channel import Outcome
from cellactors.actors.messages import (
    EditRuntime,
    FireAlarm,
    Invoke,
    ReadOutbox,
    RollBack,
    TakeImage,
)
from cellactors.actors.rollback_run import roll_back
from cellactors.actors.schedule_fire import fire as fire_schedule
from cellactors.actors.sockets import is_refusal
from cellactors.actors.typed import typed_method
from cellactors.core import alarms
from cellactors.core.principal import Principal, scoped_key
from cellactors.errors import (
    FAILED,
    UNKNOWN,
    BadResult,
    CallCycle,
    KeyConflict,
    NodeStorageFault,
)
from cellactors.persistence.celldb import calls
from cellactors.persistence.celldb.capture import TxnChanges
from cellactors.persistence.celldb.database import ReadInterrupted, to_txn
from cellactors.tracing import spans

log = logging.getLogger("cellactors.actors.cell")


def escaped_cycle(err: CallCycle) -> CallCycle:
    """The answer of a method a call cycle's refusal escaped from: the same 409
    ``call_cycle`` (not a ``method_failed`` hiding it), outcome ``failed``: it ran and
    was rolled back."""
    answer = CallCycle(str(err))
    answer.outcome = FAILED
    return answer


R = TypeVar("R")

#: What :meth:`CellExecutor.dispatch` answers for a message that is not the runtime's.
NOT_MINE: Any = object()


class Executed(Protocol):
    """The cell as its executor sees it (a :class:`~cellactors.actors.cell.CellActor`)."""

    cell_id: str
    _chain: tuple[str, ...]
    _caller: Principal | None
    _in_txn: bool
    alarm_max_failures: ClassVar[int]
    alarm_backoff_s: ClassVar[float]
    alarm_backoff_max_s: ClassVar[float]

    def on_alarm(self) -> None: ...

    @classmethod
    def read_only_methods(cls) -> frozenset[str]: ...


class CellExecutor:
    """Runs one activation's messages for ``cell`` on ``runtime`` (see the module)."""

    def __init__(self, cell: Executed, runtime: CellRuntime) -> None:
        self.cell = cell
        self.runtime = runtime

    def invoke_inline(self, msg: Invoke) -> None:
        try:
            self._invoke(msg)
        except BaseException as err:  # the read-only transaction rolled back; never the
            # caller's thread (the event loop) that goes down with it
            failure = user_failure(err, f"read-only call {self.cell.cell_id}.{msg.method}")
            with contextlib.suppress(queue.Full):  # unless it was answered already
                msg.reply.set_exception((type(failure), failure, None))

    def dispatch(self, message: Any) -> Any:
        """Handle one of the runtime's messages; :data:`NOT_MINE` for any other."""
        if isinstance(message, Invoke):
            self._invoke(message)
            return None
        if isinstance(message, TakeImage):
            rt = self.runtime
            return self._reading(lambda: (rt.next_txid - 1, rt.database.image()))
        if isinstance(message, FireAlarm):
            self._fire(message)
            return None
        if isinstance(message, ReadOutbox):
            rt = self.runtime
            return self._reading(lambda: (rt.database.tables.messages(), rt.channel.acked))
        if isinstance(message, EditRuntime):
            self._edit_runtime(message)
            return None
        if isinstance(message, RollBack):
            self._roll_back(message)
            return None
        return NOT_MINE

    def _reading(self, read: Callable[[], R]) -> R:
        """A read of the runtime's outside any call (a snapshot image, the outbox): never
        from a broken file, and a storage error raised as the fault it is."""
        database = self.runtime.database
        database.check_usable()
        try:
            return read()
        except Exception as err:
            fault = database.storage_fault(err)
            if fault is None:
                raise
            raise fault from err

    def storage_fault_of(self, err: BaseException) -> NodeStorageFault | None:
        """``err`` as a fault of this cell's own storage: one its database raised, or a raw
        storage error of a read outside a transaction. A fault another cell's node raised
        into a method is none of this cell's."""
        database = self.runtime.database
        if database.raised_here(err):
            assert isinstance(err, NodeStorageFault)
            return err
        if isinstance(err, NodeStorageFault):
            return None
        return database.storage_fault(err)

    def _alarm_policy(self) -> alarms.AlarmPolicy:
        cls = type(self.cell)
        return alarms.AlarmPolicy(
            cls.alarm_max_failures, cls.alarm_backoff_s, cls.alarm_backoff_max_s
        )

    def _run(
        self,
        fn: Callable[[], Any],
        check: Callable[[Any], None] | None = None,
        on_write: Callable[[Any], None] | None = None,
        read_only: bool = False,
        interrupt_at: float | None = None,
    ) -> tuple[Any, TxnChanges]:
        """One transaction of this cell (alarm and outbox usable inside it, unless
        ``read_only``: then it may not write at all)."""
        rt = self.runtime
        rt.database.tables.touched = False
        rt.database.sockets.sent.clear()
        self.cell._in_txn = True
        try:
            return rt.database.run(
                fn, check, on_write, read_only=read_only, interrupt_at=interrupt_at
            )
        except BaseException:
            rt.database.sockets.forget()  # rolled back: its copy of the sockets may be off
            raise
        finally:
            self.cell._in_txn = False

    def _span(self, parent: spans.Context | None, method: str) -> spans.Span:
        """The span of one message run on the cell's thread (``cellactors.run``), under the
        sender's context: the cell, method and epoch; the txid and outcome come later."""
        if not spans.enabled():
            return spans.OFF
        cls_name, _, name = self.cell.cell_id.partition(":")
        return spans.span(
            "cellactors.run",
            parent,
            cell=self.cell.cell_id,
            cell_class=cls_name,
            cell_name=name,
            method=method,
            epoch=self.runtime.epoch,
        )

    def _commit(
        self, changes: TxnChanges, outcome: Outcome, rollback: tuple[int, int] | None = None
    ) -> None:
        """Hand a committed transaction to the replicator, with its new wake state when it
        touched the alarm or the outbox; a refusal of the channel fails ``outcome``."""
        if changes.empty:
            return
        spans.note(spans.TXID, self.runtime.next_txid)
        trace = spans.current()  # the run's: the acknowledgement's span is its child
        with spans.child("cellactors.commit", txid=self.runtime.next_txid):
            self._hand_over(changes, outcome, trace, rollback)

    def _hand_over(
        self,
        changes: TxnChanges,
        outcome: Outcome,
        trace: spans.Context | None,
        rollback: tuple[int, int] | None,
    ) -> None:
        rt = self.runtime
        try:
            effect = rt.database.tables.state() if rt.database.tables.touched else None
            image = rt.database.image() if changes.schema_changed else None
        except Exception as err:
            # Committed in the file, but it cannot be shipped: the file is not the bucket's
            # any more. Nothing of it leaves this node, and the file is discarded.
            fault = rt.database.storage_fault(err, broken=True)
            if fault is None:
                raise
            outcome.error, outcome.value = fault, None
            return
        txn = to_txn(rt.next_txid, changes, image, rt.clock.now_ms(), rollback)
        rt.next_txid += 1
        try:
            pushes = rt.database.sockets.sent
            rt.channel.commit(txn, effect, trace, list(pushes) if pushes else None)
        except BaseException as err:
            outcome.error, outcome.value = err, None

    def _fire(self, msg: FireAlarm) -> None:
        """Run ``on_alarm`` or ``on_schedule`` for whichever of the alarm and the schedules
        is due first (one per message); on failure, record the retry (or drop the alarm
        after the last one) in a transaction of its own."""
        msg.started = True
        with self._span(msg.trace, "on_alarm"):
            self._fire_traced(msg)

    def _fire_traced(self, msg: FireAlarm) -> None:
        rt = self.runtime
        outcome = Outcome(msg.reply, "not_due")
        try:
            self._fire_if_due(rt, outcome)
        except Exception as err:  # the node's storage failed: the alarm stays as it was
            fault = self.storage_fault_of(err)
            if fault is None:
                raise
            outcome.error, outcome.value = fault, None
        spans.note_outcome(outcome.error)
        rt.channel.hold(outcome)
        rt.channel.note_progress()

    def _fire_if_due(self, rt: CellRuntime, outcome: Outcome) -> None:
        """The body of :meth:`_fire`: a fault of this node's storage is raised, never
        counted as a failure of ``on_alarm``."""
        rt.database.check_usable()
        row = rt.database.tables.alarm()
        first = rt.database.tables.schedules.first()
        now_ms = rt.clock.now_ms()
        if first is not None and first.at_ms <= now_ms and (row is None or first.wake < row.wake):
            rt.last_used = time.monotonic()
            self.cell._chain = (self.cell.cell_id,)
            self.cell._caller = None  # the runtime's own: no caller
            fire_schedule(self, rt, outcome, first)
        elif row is not None and row.at_ms <= now_ms:
            rt.last_used = time.monotonic()
            self.cell._chain = (self.cell.cell_id,)
            self.cell._caller = None  # the runtime's own: no caller

            def body() -> None:
                self.cell.on_alarm()
                with rt.database.runtime_writes() as tables:
                    tables.delete_alarm(row.nonce)  # consumed, unless on_alarm set a new one

            spans.link_current(spans.parent_from(row.trace))  # to the call that set it
            try:
                _, changes = self._run(body)
                outcome.value = "fired"
            except Exception as err:
                if self.storage_fault_of(err) is not None:
                    raise
                failures = row.failures + 1
                again = alarms.retry_at(self._alarm_policy(), failures, rt.clock.now_ms())
                cells_log.error(
                    "on_alarm of %s failed (%d in a row): %s: %s",
                    self.cell.cell_id,
                    failures,
                    type(err).__name__,
                    err,
                    exc_info=err,
                )

                def record() -> None:
                    with rt.database.runtime_writes() as tables:
                        if again is None:
                            tables.delete_alarm(row.nonce)
                        else:
                            tables.set_alarm(again, failures, row.trace)

                try:
                    _, changes = self._run(record)
                    outcome.value = "abandoned" if again is None else "retry"
                except Exception as failure:  # the retry could not be recorded: fire again
                    outcome.error, outcome.value = failure, None
                    changes = TxnChanges()
            self._commit(changes, outcome)

    def _edit_runtime(self, msg: EditRuntime) -> None:
        """The runtime's own transaction on its tables (the outbox deleting delivered
        messages and burying dead letters, an operator's retry or purge); its answer is held
        like a call's. A failure rolls it back and is the answer."""
        msg.started = True
        rt = self.runtime
        outcome = Outcome(msg.reply)

        def body() -> Any:
            with rt.database.runtime_writes() as tables:
                return msg.apply(tables, rt.next_txid)

        try:
            outcome.value, changes = self._run(body)
            self._commit(changes, outcome)
        except Exception as err:
            outcome.error, outcome.value = err, None
        rt.channel.hold(outcome)
        rt.channel.note_progress()

    def _roll_back(self, msg: RollBack) -> None:
        msg.started = True
        outcome = Outcome(msg.reply)
        roll_back(self, self.runtime, msg, outcome)
        self.runtime.channel.hold(outcome)
        self.runtime.channel.note_progress()

    def _invoke(self, msg: Invoke) -> None:
        msg.started = True
        with self._span(msg.trace, msg.method) as span:
            self._invoke_traced(msg)
            span.share(msg.trace, spans.EPOCH, spans.TXID)  # onto the call's span

    def _invoke_traced(self, msg: Invoke) -> None:
        fn = getattr(self.cell, msg.method)
        self.cell._chain = (*msg.chain, self.cell.cell_id)
        self.cell._caller = msg.caller
        digest = ""
        if msg.key is not None:
            answered, digest = self._replay(msg, fn)
            if answered:
                return
        fn = typed_method(type(self.cell), msg.method, fn)
        self.transact(fn, msg.args, msg.kwargs, msg.reply, msg, digest)

    def _replay(self, msg: Invoke, fn: Any) -> tuple[bool, str]:
        """Answer a keyed call from its record if the key is recorded: (True, ""). Else
        (False, digest of its arguments), taken before the method can touch them."""
        assert msg.key is not None
        rt = self.runtime
        outcome = Outcome(msg.reply)
        try:
            arguments = bound_arguments(type(self.cell), msg.method, fn, msg.args, msg.kwargs)
            digest = calls.args_digest(arguments, msg.args, msg.kwargs)
            rt.database.check_usable()
            try:
                recorded = rt.database.calls.lookup(
                    scoped_key(msg.key, msg.caller, msg.chain), msg.retention, rt.clock.now_ms()
                )
            except Exception as err:
                fault = rt.database.storage_fault(err)
                if fault is None:
                    raise
                raise fault from err
            if recorded is None:
                return False, digest
            rt.last_used = time.monotonic()
            if recorded.method != msg.method:
                raise KeyConflict(
                    f"idempotency key {msg.key!r} is recorded for method {recorded.method!r}"
                )
            if recorded.args_sha256 != digest:
                raise KeyConflict(
                    f"idempotency key {msg.key!r} is recorded for {msg.method} with other arguments"
                )
            outcome.value = calls.decode(recorded.result)
            if msg.result_check is not None:
                try:
                    run_result_check(msg.result_check, outcome.value)
                except BadResult as err:
                    # The recorded call did take effect: "failed" (rolled back) would be false.
                    err.outcome = UNKNOWN
                    raise
        except Exception as err:
            outcome.error, outcome.value = err, None
        spans.note_outcome(outcome.error)
        # Like any answer, it waits for every earlier transaction (the record's included).
        rt.channel.hold(outcome)
        rt.channel.note_progress()
        return True, ""

    def transact(
        self,
        fn: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        reply: pykka.Future[Any],
        call: Invoke | None = None,
        digest: str = "",
    ) -> None:
        """Run one call (or ``on_activate``, with no ``call``) as a transaction and hold its
        answer; a keyed call that writes is recorded under ``digest`` in the same one."""
        rt = self.runtime
        rt.last_used = time.monotonic()
        outcome = Outcome(reply)
        key = call.key if call is not None else None
        if key is not None and call is not None:
            key = scoped_key(key, call.caller, call.chain)  # callers' keys never meet
        encoded = b""

        def check(result: Any) -> None:
            nonlocal encoded
            encoded = encode_result(result)
            # A keyed call answers what its record will replay: the msgpack round trip.
            outcome.value = calls.decode(encoded) if key is not None else result
            if call is not None and call.result_check is not None:
                run_result_check(call.result_check, outcome.value)

        def on_write(_result: Any) -> None:
            assert call is not None
            now = rt.clock.now_ms()
            if key is not None:
                rt.database.calls.record(key, call.method, digest, encoded, now)
            rt.database.calls.collect(call.retention, now)

        try:
            _, changes = self._run(
                lambda: fn(*args, **kwargs),
                check,
                on_write if call is not None else None,
                read_only=call is not None and call.method in type(self.cell).read_only_methods(),
                interrupt_at=call.interrupt_at if call is not None else None,
            )
        except ReadInterrupted:
            assert call is not None
            call.interrupted = True  # not answered: the node sends it again off the loop
            return
        except BadResult as err:
            outcome.error, outcome.value = err, None
        except Exception as err:  # the user's method raised, or the node's storage failed
            fault = self.storage_fault_of(err)
            if fault is not None:  # rolled back: nothing applied, nothing shipped
                outcome.error, outcome.value = fault, None
            elif is_refusal(err):  # the runtime refused a socket event: not the cell's code
                outcome.error, outcome.value = err, None
            elif isinstance(err, CallCycle):  # a cycle refused further in: still a 409
                outcome.error, outcome.value = escaped_cycle(err), None
            else:  # rolled back, reported; the original (with its traceback) as the cause
                what = f"{self.cell.cell_id}.{call.method if call is not None else 'on_activate'}"
                outcome.error, outcome.value = user_failure(err, what), None
        else:
            self._commit(changes, outcome)
        if call is not None:
            spans.note_outcome(outcome.error)
        rt.channel.hold(outcome)
        if call is not None:  # (on_activate's is no progress: the first message is awaited)
            rt.channel.note_progress()
