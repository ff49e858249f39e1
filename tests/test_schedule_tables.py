"""The schedules table on a bare SQLite connection: ordering, the one wake entry the
runtime tables derive from it, and a run's consumption (re-armed, deleted, or left to what
the handler set)."""

from __future__ import annotations

import sqlite3

from cellactors.actors.schedule_fire import consume
from cellactors.core.alarms import Wake
from cellactors.core.schedules import Spec
from cellactors.persistence.celldb.runtime_tables import RuntimeTables

AT = Spec("at")
NOW = 1_790_000_000_000


def tables() -> RuntimeTables:
    return RuntimeTables(sqlite3.connect(":memory:", isolation_level=None))


def test_rows_list_next_first_and_delete_by_nonce() -> None:
    t = tables()
    assert t.schedules.all() == [] and t.schedules.first() is None and not t.touched
    b = t.schedules.put("b", AT, NOW + 20, {"k": [1, "x"]})
    a = t.schedules.put("a", AT, NOW + 20, None)
    c = t.schedules.put("c", Spec("every", 5, NOW + 10), NOW + 10, "p")
    assert t.touched
    assert [r.name for r in t.schedules.all()] == ["c", "a", "b"]
    assert t.schedules.first() == c
    assert t.schedules.get("b") == b and b.payload == {"k": [1, "x"]}
    assert t.schedules.delete("a", nonce="other") is False
    assert t.schedules.delete("a", nonce=a.nonce) is True
    assert t.schedules.delete("a") is False
    assert [r.name for r in t.schedules.all()] == ["c", "b"]


def test_one_wake_for_the_first_of_alarm_and_schedules() -> None:
    t = tables()
    rows = [t.schedules.put(f"s{i:02d}", AT, NOW + 1000 + i, i) for i in range(20)]
    first = t.state().alarm
    assert first == rows[0].wake
    t.schedules.put("later", AT, NOW + 5000, None)
    assert t.state().alarm == first  # same entry: nothing to write in the bucket
    alarm = t.set_alarm(NOW + 500)
    assert t.state().alarm == Wake(NOW + 500, alarm.nonce)
    t.delete_alarm()
    for row in rows:
        t.schedules.delete(row.name)
    assert t.state().alarm == t.schedules.get("later").wake  # type: ignore[union-attr]


def test_a_run_deletes_a_one_shot_and_re_arms_a_recurring_one() -> None:
    t = tables()
    once = t.schedules.put("once", AT, NOW, None)
    every = t.schedules.put("tick", Spec("every", 1000, NOW), NOW, "p", at_ms=NOW + 400, failures=2)
    consume(t, once, NOW + 3)
    assert t.schedules.get("once") is None
    consume(t, every, NOW + 2500)  # late by two and a half intervals: one run, on the grid
    again = t.schedules.get("tick")
    assert again is not None
    assert (again.due_ms, again.at_ms, again.failures, again.payload) == (
        NOW + 3000,
        NOW + 3000,
        0,
        "p",
    )
    assert again.nonce != every.nonce


def test_a_run_leaves_what_its_handler_set_or_cancelled() -> None:
    t = tables()
    old = t.schedules.put("x", AT, NOW, None)
    mine = t.schedules.put("x", AT, NOW + 9000, "set by the handler")
    consume(t, old, NOW + 1)
    assert t.schedules.get("x") == mine
    t.schedules.delete("x")
    consume(t, mine, NOW + 1)
    assert t.schedules.get("x") is None
