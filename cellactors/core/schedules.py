"""Pure rules of a cell's named schedules: what a ``schedule(...)`` call means, and when a
schedule is due next.

Nothing here does I/O: the runtime stores what these functions answer
(docs/writing-a-cell.md, "Schedules").

- :func:`plan`: a ``schedule(...)`` call's arguments as a :class:`Spec` and its first due
  time, or the error that refuses them.
- :func:`next_due`: when a recurring schedule is due after it fired (None: a one-shot).
- :func:`cron_next`: the next instant a cron expression matches in an IANA time zone.
- :func:`check_name`: which names a cell may use.

Times are epoch milliseconds. ``every`` schedules are anchored: the n-th run is due at
``anchor + n * every``, so a late fire never pushes the later ones back (no drift), and runs
missed while nothing could fire them are coalesced into one. Cron expressions are matched
against the wall clock of their time zone: a wall time skipped by a DST change fires at the
same offset as before the change (02:30 on a spring-forward night in Paris fires at 03:30
CEST), and a wall time repeated by one fires once, at its first occurrence.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter  # type: ignore[import-untyped,unused-ignore]

from cellactors.core.alarms import to_ms

#: The name ``set_alarm`` uses: the cell's one alarm is the schedule of this name.
ALARM_NAME = "@alarm"
#: The longest schedule name, in characters.
MAX_NAME = 200
#: The shortest interval of an ``every`` schedule, in milliseconds.
MIN_EVERY_MS = 1
#: How many candidate wall times :func:`cron_next` tries before giving up on an expression
#: that never matches an instant after the reference (e.g. ``0 0 30 2 *``: February 30th).
CRON_TRIES = 64

KINDS = ("at", "every", "cron")


@dataclass(frozen=True)
class Spec:
    """How a schedule recurs: ``kind`` is ``at`` (once), ``every`` (``every_ms`` apart,
    from ``anchor_ms``) or ``cron`` (``cron`` matched in time zone ``tz``)."""

    kind: str
    every_ms: int = 0
    anchor_ms: int = 0
    cron: str = ""
    tz: str = "UTC"

    def to_dict(self) -> dict[str, object]:
        """The spec as stored (JSON-able), without the fields its kind leaves unused."""
        if self.kind == "every":
            return {"kind": "every", "every_ms": self.every_ms, "anchor_ms": self.anchor_ms}
        if self.kind == "cron":
            return {"kind": "cron", "cron": self.cron, "tz": self.tz}
        return {"kind": "at"}

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> Spec:
        kind = str(data["kind"])
        if kind == "every":
            every = data["every_ms"]
            anchor = data["anchor_ms"]
            assert isinstance(every, int) and isinstance(anchor, int)
            return cls(kind, every_ms=every, anchor_ms=anchor)
        if kind == "cron":
            return cls(kind, cron=str(data["cron"]), tz=str(data["tz"]))
        return cls("at")


def check_name(name: object, reserved_ok: bool = False) -> str:
    """``name`` if a cell may name a schedule so: a non-empty string of at most
    :data:`MAX_NAME` characters, not starting with ``@`` (the runtime's own names) unless
    ``reserved_ok``."""
    if not isinstance(name, str):
        raise TypeError(f"a schedule name is a string, not {type(name).__name__}")
    if not name or len(name) > MAX_NAME:
        raise ValueError(f"a schedule name has 1 to {MAX_NAME} characters")
    if name.startswith("@") and not (reserved_ok and name == ALARM_NAME):
        raise ValueError(f"schedule names starting with '@' are the runtime's: {name!r}")
    return name


def zone(tz: str) -> ZoneInfo:
    """The IANA time zone ``tz`` (e.g. ``Europe/Paris``), or ValueError."""
    if not isinstance(tz, str) or not tz:
        raise ValueError(f"a time zone is an IANA name such as 'Europe/Paris', not {tz!r}")
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError) as err:
        raise ValueError(f"unknown time zone {tz!r}") from err


def seconds_ms(value: float | int | timedelta, what: str) -> int:
    """A duration (seconds or a timedelta) in milliseconds; it must be positive."""
    if isinstance(value, timedelta):
        ms = round(value.total_seconds() * 1000)
    elif isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} is seconds or a timedelta, not {type(value).__name__}")
    elif value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"invalid {what}: {value!r}")
    else:
        ms = round(value * 1000)
    if ms < 0:
        raise ValueError(f"{what} must not be negative: {value!r}")
    return ms


def at_ms(at: float | int | datetime, tz: str | None) -> int:
    """An absolute time in epoch ms; a naive datetime is read in ``tz`` when given (else in
    the machine's local time, as ``set_alarm`` reads it)."""
    if isinstance(at, datetime) and at.tzinfo is None and tz is not None:
        at = at.replace(tzinfo=zone(tz))
    return to_ms(at)


def check_cron(expr: str) -> str:
    """``expr`` if it is a five-field cron expression croniter accepts, else ValueError."""
    if not isinstance(expr, str):
        raise TypeError(f"a cron expression is a string, not {type(expr).__name__}")
    if len(expr.split()) != 5 or not croniter.is_valid(expr):
        raise ValueError(f"invalid cron expression {expr!r} (five fields: m h dom mon dow)")
    return expr


def plan(
    now_ms: int,
    at: float | int | datetime | None = None,
    after: float | int | timedelta | None = None,
    every: float | int | timedelta | None = None,
    cron: str | None = None,
    tz: str | None = None,
) -> tuple[Spec, int]:
    """(spec, first due time) of a ``schedule(...)`` call at ``now_ms``.

    Exactly one of ``at``, ``after``, ``every`` and ``cron``, except that ``every`` may be
    given a start with ``at`` or ``after`` (else its first run is one interval from now).
    ``tz`` names the zone of ``cron`` (default UTC) and of a naive ``at`` datetime."""
    if at is not None and after is not None:
        raise ValueError("give at= or after=, not both")
    if cron is not None and (at is not None or after is not None or every is not None):
        raise ValueError("cron= cannot be combined with at=, after= or every=")
    if tz is not None:
        zone(tz)
        if cron is None and not isinstance(at, datetime):
            raise ValueError("tz= applies to cron= and to a naive at= datetime only")
    start: int | None = None
    if at is not None:
        start = at_ms(at, tz)
    elif after is not None:
        start = now_ms + seconds_ms(after, "after")
    if every is not None:
        every_ms = seconds_ms(every, "every")
        if every_ms < MIN_EVERY_MS:
            raise ValueError("every must be at least a millisecond")
        first = now_ms + every_ms if start is None else start
        return Spec("every", every_ms=every_ms, anchor_ms=first), first
    if cron is not None:
        spec = Spec("cron", cron=check_cron(cron), tz=tz or "UTC")
        first_cron = cron_next(spec.cron, spec.tz, now_ms)
        if first_cron is None:
            raise ValueError(f"cron expression {cron!r} never matches")
        return spec, first_cron
    if start is None:
        raise ValueError("give one of at=, after=, every= or cron=")
    return Spec("at"), start


def next_due(spec: Spec, due_ms: int, now_ms: int) -> int | None:
    """When a schedule that was due at ``due_ms`` and has just run (at ``now_ms``) is due
    next; None for a one-shot (or a cron expression that never matches again). Always
    later than both ``due_ms`` and ``now_ms``: runs missed meanwhile are coalesced."""
    after = max(due_ms, now_ms)
    if spec.kind == "every":
        if after < spec.anchor_ms:
            return spec.anchor_ms
        periods = (after - spec.anchor_ms) // spec.every_ms + 1
        return spec.anchor_ms + periods * spec.every_ms
    if spec.kind == "cron":
        return cron_next(spec.cron, spec.tz, after)
    return None


def cron_next(expr: str, tz: str, after_ms: int) -> int | None:
    """The first instant strictly after ``after_ms`` at which ``expr`` matches the wall
    clock of ``tz`` (see the module for DST); None if it never does."""
    info = zone(tz)
    after = datetime.fromtimestamp(after_ms / 1000, timezone.utc)
    wall = after.astimezone(info).replace(tzinfo=None, fold=0)
    # Match whole minutes: the wall time is truncated, so the minute containing ``after``
    # itself is never a candidate (its instant is not after the reference, or not by one
    # whole match).
    it = croniter(expr, wall.replace(second=0, microsecond=0))
    for _ in range(CRON_TRIES):
        try:
            candidate: datetime = it.get_next(datetime)
        except (StopIteration, ValueError, OverflowError):  # croniter found no next match
            return None
        instant = candidate.replace(tzinfo=info, fold=0)
        ms = int(instant.timestamp() * 1000)
        if ms > after_ms:
            return ms
    return None


def earliest(due: dict[str, int]) -> tuple[str, int] | None:
    """(name, due time) of the schedule due first (ties: the least name), or None."""
    if not due:
        return None
    name = min(due, key=lambda n: (due[n], n))
    return name, due[name]


__all__ = [
    "ALARM_NAME",
    "KINDS",
    "Spec",
    "check_cron",
    "check_name",
    "cron_next",
    "earliest",
    "next_due",
    "plan",
]
