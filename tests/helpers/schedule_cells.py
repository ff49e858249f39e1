"""Cells of the schedule tests (in-process nodes and the testing fleet)."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from typing import Any

from cellactors import CellActor

#: Runs of ``on_schedule`` still to fail, by "<cell name>/<schedule name>": a count kept
#: outside the cell's database, which the failing run's rollback cannot undo.
FAILS: dict[str, int] = {}
#: Runs of ``on_schedule`` started, by "<cell name>/<schedule name>" (durable or not).
ATTEMPTS: Counter[str] = Counter()


class Planner(CellActor):
    """Sets, lists and cancels schedules; records every run of ``on_schedule``."""

    alarm_backoff_s = 0.2
    alarm_backoff_max_s = 1.0
    alarm_max_failures = 3

    def on_activate(self) -> None:
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS runs "
            "(seq INTEGER PRIMARY KEY, name TEXT, payload TEXT, at REAL)"
        )

    def plan(self, name: str, **spec: Any) -> float:
        return self.schedule(name, **spec)

    def plan_many(self, count: int, after: float) -> None:
        for i in range(count):
            self.schedule(f"s{i:02d}", after=after + i, payload={"i": i})

    def plan_and_fail(self, name: str, after: float) -> None:
        self.schedule(name, after=after)
        raise RuntimeError("rolled back, schedule and all")

    def arm(self, delay: float) -> None:
        self.set_alarm(self.now() + delay)

    def on_alarm(self) -> None:
        self.db.execute(
            "INSERT INTO runs (name, payload, at) VALUES ('@alarm', 'null', ?)", [self.now()]
        )

    def on_schedule(self, name: str, payload: Any) -> None:
        key = f"{self.name}/{name}"
        ATTEMPTS[key] += 1
        if FAILS.get(key, 0) > 0:
            FAILS[key] -= 1
            raise RuntimeError(f"failing run of {name}")
        self.db.execute(
            "INSERT INTO runs (name, payload, at) VALUES (?, ?, ?)",
            [name, json.dumps(payload), self.now()],
        )

    def listing(self) -> list[dict[str, Any]]:
        return [dataclasses.asdict(s) for s in self.schedules()]

    def drop(self, name: str) -> bool:
        return self.cancel_schedule(name)

    def runs(self) -> list[list[Any]]:
        rows = self.db.execute("SELECT name, payload, at FROM runs ORDER BY seq")
        return [[n, json.loads(p), a] for n, p, a in rows]
