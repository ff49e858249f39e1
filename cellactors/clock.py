"""The clocks of a node: monotonic time, wall time, and the store's time.

- :func:`mono` is the clock deadlines are measured on (the lease's fence deadline, call
  timeouts of the protocol). On Linux it is ``CLOCK_BOOTTIME``: monotonic, and it keeps
  counting while the machine is suspended, so a node that wakes from a suspend finds its
  deadline passed instead of serving from a lease that lapsed meanwhile.
- :func:`wall_ms` is this machine's wall clock. The protocol never decides anything on it;
  it is logged and compared with the store's.
- :class:`StoreClock` is what the process knows of one store's clock, fed by the ``Date`` of
  every answer of that store (:mod:`cellactors.core.store_clock`). Lease expiries, takeovers,
  alarms and retention are judged on it, so nodes with wrong or jumping wall clocks still
  agree.
"""

from __future__ import annotations

import datetime
import email.utils
import logging
import threading
import time
from collections.abc import Callable, Hashable

from cellactors.core import store_clock
from cellactors.core.store_clock import Bounds

log = logging.getLogger(__name__)

_BOOTTIME = getattr(time, "CLOCK_BOOTTIME", None)

#: Disagreements of the store's answers up to this are absorbed without a word (servers of
#: one endpoint whose clocks differ by a few milliseconds); larger ones are reported to the
#: clock's listeners, which judge them against their own lease margins.
REPORT_MS = 100.0


def mono() -> float:
    """Seconds on the clock deadlines are measured on (see the module docstring)."""
    if _BOOTTIME is not None:
        return time.clock_gettime(_BOOTTIME)
    return time.monotonic()


def wall_ms() -> int:
    """This machine's wall clock, in milliseconds."""
    return int(time.time() * 1000)


def local_time(ms: int) -> str:
    """A time in epoch milliseconds as people read it in a log: ISO-like, local time with
    its offset (``2026-12-03 21:12:37.334+00:00``)."""
    moment = datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc).astimezone()
    return moment.isoformat(sep=" ", timespec="milliseconds")


def http_date_ms(value: str | None) -> int | None:
    """The time an HTTP ``Date`` header names (whole seconds), or None."""
    if not value:
        return None
    try:
        return int(email.utils.parsedate_to_datetime(value).timestamp() * 1000)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None


JumpListener = Callable[[float], None]


class StoreClock:
    """The store's time as this process knows it: bounds fed by every answer of the store,
    carried forward on :func:`mono`. Thread-safe.

    Until the first answer (or for a store whose answers carry no ``Date``) it knows
    nothing, and every reading falls back to the wall clock: the behaviour of a node that
    trusts its own clock, logged once."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._bounds: Bounds | None = None
        self._listeners: list[JumpListener] = []
        self.answers = 0  # answers that carried a usable Date
        self.jumps = 0

    # --- feeding ----------------------------------------------------------------------

    def observe(
        self, sent: float, received: float, date: str | None, resolution_ms: int = 1000
    ) -> None:
        """One answer, sent at ``sent`` and received at ``received`` (:func:`mono`), whose
        ``Date`` header is ``date``."""
        server_ms = http_date_ms(date)
        if server_ms is not None:
            self.observe_ms(sent, received, server_ms, resolution_ms)

    def observe_ms(self, sent: float, received: float, server_ms: int, resolution_ms: int) -> None:
        """One answer whose store time is ``server_ms``, truncated to ``resolution_ms``."""
        sample = store_clock.sample_bounds(sent, received, server_ms, resolution_ms)
        with self._lock:
            merged = store_clock.merge(self._bounds, sample, REPORT_MS)
            self._bounds = merged.bounds
            self.answers += 1
            if merged.jump_ms is not None:
                self.jumps += 1
            listeners = list(self._listeners) if merged.jump_ms is not None else []
        if merged.jump_ms is not None:
            log.warning(
                "the clock of store %s moved %+.3fs against this machine's monotonic clock",
                self.name,
                merged.jump_ms / 1000,
            )
        for listener in listeners:
            try:
                listener(merged.jump_ms or 0.0)
            except Exception:
                log.exception("a store clock listener failed")

    def on_jump(self, listener: JumpListener) -> Callable[[], None]:
        """Call ``listener(ms)`` whenever an answer shows the store's time moved ``ms``
        (positive: forward) against the monotonic clock. Returns the unsubscribe."""
        with self._lock:
            self._listeners.append(listener)

        def unsubscribe() -> None:
            with self._lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)

        return unsubscribe

    # --- reading ----------------------------------------------------------------------

    def bounds(self, at: float | None = None) -> Bounds | None:
        """The store's time at ``at`` (default: now), or None before any answer."""
        with self._lock:
            known = self._bounds
        if known is None:
            return None
        return known.advanced(mono() if at is None else at)

    def known(self) -> bool:
        with self._lock:
            return self._bounds is not None

    def now_ms(self) -> int:
        """The best estimate of the store's time now (the middle of the bounds), or the
        wall clock before any answer."""
        b = self.bounds()
        return int(b.mid_ms) if b is not None else wall_ms()

    def low_ms(self, at: float | None = None) -> int:
        """A time the store's clock has surely reached (at ``at``, default now): lease
        expiries and alarms are judged on it, so neither is ever early."""
        b = self.bounds(at)
        return int(b.low_ms) if b is not None else wall_ms()

    def expiry_ms(self, sent: float, ttl_s: float) -> int:
        """The ``expires_ms`` of a lease write sent at ``sent`` (see
        :func:`cellactors.core.store_clock.expiry_ms`)."""
        with self._lock:
            known = self._bounds
        return store_clock.expiry_ms(known, sent, ttl_s, wall_ms())

    def wall_offset_ms(self) -> tuple[int, int] | None:
        """Bounds (low, high) of this machine's wall clock minus the store's, now."""
        b = self.bounds()
        if b is None:
            return None
        wall = wall_ms()
        return int(wall - b.high_ms), int(wall - b.low_ms)


_clocks_lock = threading.Lock()
_clocks: dict[Hashable, StoreClock] = {}


def shared_store_clock(key: Hashable, name: str) -> StoreClock:
    """The process's clock of the store ``key`` names (an endpoint, say): one per store, so
    every client of that store in this process feeds and reads the same bounds."""
    with _clocks_lock:
        clock = _clocks.get(key)
        if clock is None:
            clock = _clocks[key] = StoreClock(name)
        return clock


#: How fast the runtime's clock absorbs a correction of the store's time estimate, as a
#: fraction of elapsed time: answers that narrow the bounds move the estimate by up to half a
#: second (a ``Date`` has whole seconds), and stepping would shorten a delay measured on
#: this clock (an alarm's backoff, ``set_alarm(delay=...)``) by that much.
SLEW = 0.05

#: A correction larger than this is a step, not a slew: the store's clock jumped, or this
#: process learnt the store's time for the first time (its wall clock was wrong).
STEP_MS = 2000.0


class RuntimeClock:
    """The time the runtime's own decisions read, in milliseconds: when an alarm is due,
    how old an idempotency key or an outbox message is, what a transaction is stamped with.

    It is the store's time (:meth:`StoreClock.now_ms`), so alarms fall due and transactions
    are stamped by one clock on every node, whatever each machine's wall clock says. It runs
    at the monotonic clock's rate and absorbs corrections of the estimate gradually (at most
    :data:`SLEW` of elapsed time), so a delay of ``d`` seconds on it lasts at least
    ``d / (1 + SLEW)`` real seconds; a correction over :data:`STEP_MS` is taken at once. It
    never moves back (a backward step makes it stand still until the store's time catches
    up). A test fleet adds an offset (``cellactors.testing.Fleet.advance_alarms``; leases
    keep the real clock)."""

    def __init__(self, store: StoreClock, slew: float = SLEW, step_ms: float = STEP_MS) -> None:
        self.store = store
        self.slew = slew
        self.step_ms = step_ms
        self.offset_ms = 0
        self._last: tuple[float, float] | None = None  # (mono s, value ms) of the last reading
        self._lock = threading.Lock()

    def now_ms(self) -> int:
        estimate = float(self.store.now_ms())
        at = mono()
        with self._lock:
            value = store_clock.slewed(self._last, at, estimate, self.slew, self.step_ms)
            self._last = (at, value)
            return int(value) + self.offset_ms

    def now(self) -> float:
        """The same time in epoch seconds (what ``CellActor.now`` returns)."""
        return self.now_ms() / 1000

    def advance(self, seconds: float) -> None:
        """Move this clock forward (tests only)."""
        if seconds < 0:
            raise ValueError("the runtime's clock only moves forward")
        with self._lock:
            self.offset_ms += int(seconds * 1000)
