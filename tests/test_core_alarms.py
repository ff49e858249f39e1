"""The pure decisions of alarms, wake entries, call chains and the outbox (no store, no
threads)."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from cellactors.core import alarms
from cellactors.core.alarms import Action, AlarmPolicy, Pending, Schedule, Wake, WakeState
from cellactors.persistence.control.wakes import parse_wake_key, wake_key


def test_retry_backs_off_exponentially_up_to_the_cap_then_abandons() -> None:
    policy = AlarmPolicy(max_failures=5, backoff_s=1.0, backoff_max_s=5.0)
    assert [alarms.retry_at(policy, n, 1000) for n in range(1, 6)] == [
        2000,
        3000,
        5000,
        6000,
        None,
    ]
    with pytest.raises(ValueError):
        AlarmPolicy(max_failures=0)
    with pytest.raises(ValueError):
        AlarmPolicy(backoff_s=5, backoff_max_s=1)


def test_alarm_times_from_seconds_or_datetimes() -> None:
    assert alarms.to_ms(12.5) == 12500
    assert alarms.to_ms(datetime(2030, 1, 1, tzinfo=timezone.utc)) == 1893456000000
    for bad in (float("nan"), -1, 1e14):
        with pytest.raises(ValueError):
            alarms.to_ms(bad)
    with pytest.raises(TypeError):
        alarms.to_ms("soon")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        alarms.to_ms(True)


def test_wake_changes_write_new_entries_first_and_delete_old_ones_after() -> None:
    a, b = Wake(10, "n1"), Wake(20, "n2")
    out = Wake(0, alarms.OUTBOX_TAG)
    assert alarms.wake_keys(WakeState(a, True)) == {a, out}
    assert alarms.wake_changes(frozenset(), WakeState(a)) == (frozenset({a}), frozenset())
    assert alarms.wake_changes(frozenset({a}), WakeState(b)) == (frozenset({b}), frozenset({a}))
    assert alarms.wake_changes(frozenset({a, out}), WakeState(a, False)) == (
        frozenset(),
        frozenset({out}),
    )
    assert alarms.wake_changes(frozenset({a}), WakeState()) == (frozenset(), frozenset({a}))


def test_scan_actions() -> None:
    due, later = Wake(100, "x"), Wake(300, "y")
    assert alarms.scan_action(later, 200, None, False, True) is Action.STOP
    assert alarms.scan_action(due, 200, frozenset({due}), False, True) is Action.LOCAL
    assert alarms.scan_action(due, 200, frozenset({later}), False, True) is Action.DROP
    assert alarms.scan_action(due, 200, None, True, True) is Action.SKIP
    assert alarms.scan_action(due, 200, None, False, False) is Action.SKIP
    assert alarms.scan_action(due, 200, None, False, True) is Action.ACTIVATE


def test_schedule_keeps_one_alarm_per_cell_in_due_order() -> None:
    s = Schedule()
    s.set("A:a", Wake(300, "1"))
    s.set("A:b", Wake(100, "2"))
    s.set("A:a", Wake(200, "3"))  # replaces the first
    assert s.next_at() == 100
    assert s.pop_due(150) == [("A:b", Wake(100, "2"))]
    assert s.pop_due(250) == [("A:a", Wake(200, "3"))]
    assert s.pop_due(10_000) == []  # the replaced item is skipped
    assert s.next_at() is None
    s.set("A:c", Wake(50, "4"))
    s.set("A:c", None)
    assert s.pop_due(10_000) == []
    # Popped alarms stay current (a fire in progress) until their cell's state changes.
    assert s.get("A:b") == Wake(100, "2") and s.get("A:c") is None and len(s) == 2
    s.set("A:d", Wake(50, "5"), at_ms=500)  # a retry later than the alarm's own time
    assert s.pop_due(100) == [] and s.pop_due(500) == [("A:d", Wake(50, "5"))]


def test_cycles_and_outbox_order() -> None:
    assert alarms.cycle_in(("A:a", "B:b"), "A:a")
    assert alarms.cycle_in(("A:a",), "A:a")
    assert not alarms.cycle_in(("A:a", "B:b"), "C:c")
    rows = [
        Pending(3, "T:x", 5),
        Pending(1, "T:x", 4),
        Pending(2, "T:y", 6),  # not acknowledged yet
        Pending(4, "T:y", 5),  # behind it: waits, order per target
        Pending(5, "T:z", 5),
    ]
    blocked: set[str] = {"T:z"}
    assert [p.seq for p in alarms.deliverable(rows, 5, blocked)] == [1, 3]
    assert blocked == {"T:y", "T:z"}
    assert alarms.delivery_backoff(1) == 0.2 and alarms.delivery_backoff(20) == 10.0


def test_wake_keys_sort_by_time_and_parse_back() -> None:
    k1 = wake_key("Reminder:a", Wake(999, "ab"))
    k2 = wake_key("Reminder:a:b.c", Wake(1000, "cd"))
    assert k1 < k2
    assert parse_wake_key(k1) == ("Reminder:a", Wake(999, "ab"))
    assert parse_wake_key(k2) == ("Reminder:a:b.c", Wake(1000, "cd"))
    for bad in ("wake/12/Reminder:a/x", "wake/0000000000000012/no-colon/x", "other/x"):
        assert parse_wake_key(bad) is None
