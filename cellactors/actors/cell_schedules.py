"""The schedules API of a cell: ``schedule``, ``schedules``, ``cancel_schedule`` and the
``on_schedule`` hook, mixed into :class:`~cellactors.actors.cell.CellActor`.

A schedule is a row of the runtime's schedules table written in the calling method's own
transaction (:mod:`cellactors.persistence.celldb.schedule_tables`): it exists exactly when
that transaction is durable. However many a cell has, the cell has one wake entry, for the
one that runs first. The due-time rules are :mod:`cellactors.core.schedules`; the fire is
the executor's (:mod:`cellactors.actors.schedule_fire`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from cellactors.core import schedules as rules
from cellactors.persistence.celldb.database import CellDatabase
from cellactors.persistence.celldb.schedule_tables import ScheduleRow, encode_payload
from cellactors.tracing import spans


@dataclass(frozen=True)
class Scheduled:
    """One schedule as :meth:`ScheduleApi.schedules` lists it: ``due`` is when it runs
    next (epoch seconds; later than its time while a failing run backs off), ``kind`` is
    ``at``, ``every`` or ``cron``; ``every`` (seconds), ``cron`` and ``tz`` say how it
    recurs; ``failures`` counts its failed runs in a row."""

    name: str
    due: float
    kind: str
    payload: Any
    every: float | None = None
    cron: str | None = None
    tz: str | None = None
    failures: int = 0


def listed(row: ScheduleRow) -> Scheduled:
    spec = row.spec
    return Scheduled(
        name=row.name,
        due=row.at_ms / 1000,
        kind=spec.kind,
        payload=row.payload,
        every=spec.every_ms / 1000 if spec.kind == "every" else None,
        cron=spec.cron if spec.kind == "cron" else None,
        tz=spec.tz if spec.kind == "cron" else None,
        failures=row.failures,
    )


class ScheduleApi:
    """Named schedules of a cell (see the module); the cell supplies its database and
    clock through the two methods below."""

    def _runtime_db(self, writing: bool = True) -> CellDatabase:
        raise NotImplementedError

    def _now_ms(self) -> int:
        raise NotImplementedError

    def on_schedule(self, name: str, payload: Any) -> None:
        """Runs when schedule ``name`` is due, with its payload, as one transaction with the
        schedule's own bookkeeping: a one-shot is consumed and a recurring one re-armed for
        its next time in it (unless the handler set or cancelled that name itself). If it
        raises, it is rolled back and retried like ``on_alarm`` (``alarm_max_failures``,
        ``alarm_backoff_s``); a recurring schedule given up moves on to its next time."""

    def schedule(
        self,
        name: str,
        *,
        at: float | datetime | None = None,
        after: float | timedelta | None = None,
        every: float | timedelta | None = None,
        cron: str | None = None,
        tz: str | None = None,
        payload: Any = None,
    ) -> float:
        """Have :meth:`on_schedule` run with ``name`` and ``payload`` (JSON-able): once
        ``at`` a time (epoch seconds or a datetime; naive read in ``tz``) or ``after``
        seconds, ``every`` seconds (from ``at``/``after`` if given, else one interval from
        now, never drifting), or whenever ``cron`` (five fields, e.g. ``"0 9 * * MON"``)
        matches the wall clock of ``tz`` (an IANA name; default UTC). Replaces a schedule
        of that name. Part of the current transaction: it exists once that is durable.
        Returns when it first runs (epoch seconds)."""
        rules.check_name(name)
        encode_payload(payload)  # refused here, in the caller's method, not at its fire
        database = self._runtime_db()
        spec, due_ms = rules.plan(self._now_ms(), at, after, every, cron, tz)
        with database.runtime_writes() as tables:
            tables.schedules.put(name, spec, due_ms, payload, trace=spans.traceparent())
        return due_ms / 1000

    def schedules(self) -> list[Scheduled]:
        """The cell's schedules, the next to run first (the alarm of ``set_alarm`` among
        them, named ``"@alarm"``)."""
        tables = self._runtime_db(writing=False).tables
        out = [listed(row) for row in tables.schedules.all()]
        alarm = tables.alarm()
        if alarm is not None:
            out.append(
                Scheduled(rules.ALARM_NAME, alarm.at_ms / 1000, "at", None, failures=alarm.failures)
            )
            out.sort(key=lambda s: (s.due, s.name))
        return out

    def cancel_schedule(self, name: str) -> bool:
        """Remove schedule ``name`` (``"@alarm"``: the alarm); False if there was none.
        Part of the current transaction."""
        rules.check_name(name, reserved_ok=True)
        with self._runtime_db().runtime_writes() as tables:
            if name == rules.ALARM_NAME:
                return tables.delete_alarm()
            return tables.schedules.delete(name)


__all__ = ["ScheduleApi", "Scheduled"]
