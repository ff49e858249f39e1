"""The fire of one due schedule, on the cell's thread (the executor's ``FireAlarm``).

``on_schedule`` and the schedule's bookkeeping are one transaction: a one-shot is deleted
and a recurring one re-armed for its next due time (:func:`cellactors.core.schedules.
next_due`) in it, unless the handler itself set or cancelled that name. So the handler's
writes and the schedule's consumption commit together: a crash before that commit fires it
again; a committed fire is never repeated. A failure rolls the handler back and records, in
a transaction of its own, the retry of the alarm's policy (:func:`cellactors.core.alarms.
retry_at`); when the policy gives up, a one-shot is dropped and a recurring one moves on
to its next due time.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from cellactors.core import alarms
from cellactors.core import schedules as rules
from cellactors.persistence.celldb.capture import TxnChanges
from cellactors.persistence.celldb.runtime_tables import RuntimeTables
from cellactors.persistence.celldb.schedule_tables import ScheduleRow
from cellactors.tracing import spans

if TYPE_CHECKING:
    from cellactors.actors.cell_runtime import CellRuntime
    from cellactors.actors.channel import Outcome

cells_log = logging.getLogger("cellactors.cells")
#: The span attribute naming the schedule a run is for.
SCHEDULE_ATTR = "cellactors.schedule"


class Firing(Protocol):
    """What a fire needs of the cell's executor
    (:class:`~cellactors.actors.executor.CellExecutor`)."""

    cell: Any

    def _run(self, fn: Callable[[], Any]) -> tuple[Any, TxnChanges]: ...
    def _commit(self, changes: TxnChanges, outcome: Outcome) -> None: ...
    def _alarm_policy(self) -> alarms.AlarmPolicy: ...
    def storage_fault_of(self, err: BaseException) -> Any: ...


def consume(tables: RuntimeTables, row: ScheduleRow, now_ms: int) -> None:
    """After a successful run: re-arm a recurring ``row`` for its next due time, delete a
    one-shot; nothing if the name no longer holds ``row`` (the handler replaced it)."""
    current = tables.schedules.get(row.name)
    if current is None or current.nonce != row.nonce:
        return
    due = rules.next_due(row.spec, row.due_ms, now_ms)
    if due is None:
        tables.schedules.delete(row.name, row.nonce)
    else:
        tables.schedules.put(row.name, row.spec, due, row.payload, row.trace)


def fire(executor: Firing, rt: CellRuntime, outcome: Outcome, row: ScheduleRow) -> None:
    """Run ``on_schedule`` for the due ``row`` and commit it (see the module); a fault of
    this node's storage is raised, never counted as the schedule's failure."""
    cell: Any = executor.cell

    def body() -> None:
        cell.on_schedule(row.name, row.payload)
        with rt.database.runtime_writes() as tables:
            consume(tables, row, rt.clock.now_ms())

    spans.link_current(spans.parent_from(row.trace))  # to the call that set it
    spans.note(spans.METHOD, "on_schedule")  # the run's span was opened as an alarm's
    spans.note(SCHEDULE_ATTR, row.name)
    try:
        _, changes = executor._run(body)
        outcome.value = "fired"
    except Exception as err:
        if executor.storage_fault_of(err) is not None:
            raise
        failures = row.failures + 1
        now = rt.clock.now_ms()
        again = alarms.retry_at(executor._alarm_policy(), failures, now)
        cells_log.error(
            "on_schedule %r of %s failed (%d in a row): %s: %s",
            row.name,
            executor.cell.cell_id,
            failures,
            type(err).__name__,
            err,
            exc_info=err,
        )

        def record() -> None:
            with rt.database.runtime_writes() as tables:
                current = tables.schedules.get(row.name)
                if current is None or current.nonce != row.nonce:
                    return
                if again is None:
                    consume(tables, row, now)
                else:
                    tables.schedules.put(
                        row.name, row.spec, row.due_ms, row.payload, row.trace, again, failures
                    )

        try:
            _, changes = executor._run(record)
            outcome.value = "abandoned" if again is None else "retry"
        except Exception as failure:  # the retry could not be recorded: fire again
            outcome.error, outcome.value = failure, None
            changes = TxnChanges()
    executor._commit(changes, outcome)


__all__ = ["consume", "fire"]
