"""The pure rules of schedules: what a ``schedule(...)`` call means, and next due times
(anchored intervals, cron in IANA zones across DST changes). No threads, no store."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cellactors.core import schedules
from cellactors.core.schedules import Spec, cron_next, next_due, plan

PARIS = ZoneInfo("Europe/Paris")
NOW = 1_790_000_000_000  # an arbitrary instant in 2026, in epoch ms


def ms(when: datetime) -> int:
    return int(when.timestamp() * 1000)


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> int:
    return ms(datetime(year, month, day, hour, minute, tzinfo=timezone.utc))


def test_plan_reads_each_kind() -> None:
    assert plan(NOW, after=2.5) == (Spec("at"), NOW + 2500)
    assert plan(NOW, at=(NOW + 10) / 1000) == (Spec("at"), NOW + 10)
    assert plan(NOW, every=timedelta(minutes=1)) == (
        Spec("every", 60_000, NOW + 60_000),
        NOW + 60_000,
    )
    assert plan(NOW, every=5, after=1) == (Spec("every", 5000, NOW + 1000), NOW + 1000)
    spec, first = plan(utc(2026, 12, 3, 10, 0), cron="0 9 * * MON", tz="Europe/Paris")
    assert spec == Spec("cron", cron="0 9 * * MON", tz="Europe/Paris")
    assert first == ms(datetime(2026, 12, 7, 9, 0, tzinfo=PARIS))  # next Monday, 9:00 CET
    # A naive datetime is read in tz.
    assert plan(NOW, at=datetime(2026, 7, 1, 12, 0), tz="Europe/Paris")[1] == utc(2026, 7, 1, 10, 0)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({}, ValueError),
        ({"at": 1.0, "after": 1.0}, ValueError),
        ({"cron": "* * * * *", "every": 1}, ValueError),
        ({"cron": "61 * * * *"}, ValueError),
        ({"cron": "* * * *"}, ValueError),
        ({"cron": "* * * * *", "tz": "Mars/Olympus"}, ValueError),
        ({"after": 1, "tz": "UTC"}, ValueError),
        ({"every": 0}, ValueError),
        ({"every": -1}, ValueError),
        ({"after": float("nan")}, ValueError),
        ({"after": "soon"}, TypeError),
        ({"every": True}, TypeError),
        ({"cron": "0 0 30 2 *"}, ValueError),  # February 30th never comes
    ],
)
def test_plan_refuses_what_means_nothing(kwargs: dict[str, object], error: type) -> None:
    with pytest.raises(error):
        plan(NOW, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["", "@alarm", "@mine", "x" * 201, 3])
def test_names_of_the_runtime_and_nonsense_are_refused(name: object) -> None:
    with pytest.raises((ValueError, TypeError)):
        schedules.check_name(name)


def test_the_alarm_name_is_allowed_where_the_runtime_allows_it() -> None:
    assert schedules.check_name("@alarm", reserved_ok=True) == "@alarm"
    assert schedules.check_name("daily report") == "daily report"


@given(
    every_ms=st.integers(1, 10**7),
    lateness=st.lists(st.integers(0, 3 * 10**7), min_size=1, max_size=30),
)
def test_every_never_drifts_however_late_its_runs(every_ms: int, lateness: list[int]) -> None:
    """Each next due time is on the anchor's grid and after the run that computed it: a late
    run does not push the later ones back, and missed runs are coalesced into one."""
    spec = Spec("every", every_ms=every_ms, anchor_ms=NOW)
    due = NOW
    for late in lateness:
        ran_at = due + late
        nxt = next_due(spec, due, ran_at)
        assert nxt is not None
        assert (nxt - NOW) % every_ms == 0
        assert ran_at < nxt <= ran_at + every_ms
        due = nxt


def test_every_before_its_anchor_runs_at_the_anchor() -> None:
    spec = Spec("every", every_ms=1000, anchor_ms=NOW + 5000)
    assert next_due(spec, NOW + 5000, NOW) == NOW + 6000  # fired early: strictly after due
    assert next_due(Spec("at"), NOW, NOW) is None


# (expression, zone, after (UTC), expected (UTC)): DST transitions of Paris (2026-03-29 at
# 02:00 CET the clock jumps to 03:00 CEST; 2026-10-25 at 03:00 CEST it goes back to 02:00 CET).
DST_TABLE = [
    # A daily time outside the transitions keeps its wall time: UTC shifts by an hour.
    ("0 9 * * *", "Europe/Paris", utc(2026, 3, 28, 12), utc(2026, 3, 29, 7)),
    ("0 9 * * *", "Europe/Paris", utc(2026, 3, 27, 12), utc(2026, 3, 28, 8)),
    ("0 9 * * *", "Europe/Paris", utc(2026, 10, 25, 12), utc(2026, 10, 26, 8)),
    # 02:30 does not exist on the spring night: it fires at 03:30 CEST (01:30 UTC), once.
    ("30 2 * * *", "Europe/Paris", utc(2026, 3, 28, 12), utc(2026, 3, 29, 1, 30)),
    ("30 2 * * *", "Europe/Paris", utc(2026, 3, 29, 1, 30), utc(2026, 3, 30, 0, 30)),
    # 02:30 happens twice on the autumn night: it fires at the first (00:30 UTC), once.
    ("30 2 * * *", "Europe/Paris", utc(2026, 10, 24, 12), utc(2026, 10, 25, 0, 30)),
    ("30 2 * * *", "Europe/Paris", utc(2026, 10, 25, 0, 30), utc(2026, 10, 26, 1, 30)),
    # Hourly across the spring gap: 01:00 CET, then 03:00 CEST (the 02:00 hour is skipped).
    ("0 * * * *", "Europe/Paris", utc(2026, 3, 29, 0, 0), utc(2026, 3, 29, 1, 0)),
    # Strictly after: a reference on a match gives the next one.
    ("0 9 * * MON", "UTC", utc(2026, 12, 7, 9), utc(2026, 12, 14, 9)),
    ("0 9 * * MON", "UTC", utc(2026, 12, 7, 9) - 1, utc(2026, 12, 7, 9)),
    # New York: 2026-03-08 02:00 EST jumps to 03:00 EDT.
    ("15 2 * * *", "America/New_York", utc(2026, 3, 7, 12), utc(2026, 3, 8, 7, 15)),
]


@pytest.mark.parametrize(("expr", "tz", "after", "expected"), DST_TABLE)
def test_cron_next_across_dst(expr: str, tz: str, after: int, expected: int) -> None:
    assert cron_next(expr, tz, after) == expected


@given(after=st.integers(utc(2026, 1, 1), utc(2027, 1, 1)))
def test_hourly_cron_in_paris_always_moves_forward_within_two_hours(after: int) -> None:
    """Whatever the instant (DST nights included), the next run is after it, on a whole
    hour of Paris wall time, and at most two real hours away."""
    nxt = cron_next("0 * * * *", "Europe/Paris", after)
    assert nxt is not None and after < nxt <= after + 2 * 3_600_000
    wall = datetime.fromtimestamp(nxt / 1000, PARIS)
    assert (wall.minute, wall.second) == (0, 0)


def test_spec_round_trips_through_its_stored_form() -> None:
    for spec in (
        Spec("at"),
        Spec("every", every_ms=250, anchor_ms=NOW),
        Spec("cron", cron="*/5 * * * *", tz="Asia/Tokyo"),
    ):
        assert Spec.from_dict(spec.to_dict()) == spec


def test_earliest_breaks_ties_by_name() -> None:
    assert schedules.earliest({}) is None
    assert schedules.earliest({"b": 5, "a": 5, "c": 4}) == ("c", 4)
    assert schedules.earliest({"b": 5, "a": 5}) == ("a", 5)
