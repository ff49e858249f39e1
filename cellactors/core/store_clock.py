"""The store's clock, as this process can know it (docs/protocol.md, "Clocks").

Lease expiries and alarm times are judged in *store time*: the clock of the object store, as
its answers' ``Date`` header shows it. One answer bounds the store's time at the moment it
arrived (the header was stamped between the request's send and the answer's arrival, and is
truncated to its resolution); between answers the bounds move with this process's monotonic
clock, widened by a drift allowance. No wall clock of any node enters them, so a wall clock
that jumps cannot move a lease's expiry or a takeover decision.

Everything here is pure: times are passed in (``mono`` in seconds of the monotonic clock,
store times in milliseconds).
"""

from __future__ import annotations

from dataclasses import dataclass

#: How far this process's monotonic clock may run from the store's, per unit of time: NTP
#: slews a clock by at most 500 ppm; twice that is allowed.
DRIFT = 1e-3


@dataclass(frozen=True)
class Bounds:
    """The store's time at monotonic time ``at`` lies in ``[low_ms, high_ms]``."""

    at: float
    low_ms: float
    high_ms: float

    def advanced(self, to: float, drift: float = DRIFT) -> Bounds:
        """The bounds at monotonic time ``to`` (later or earlier than ``at``): they move with
        the monotonic clock and widen by the drift allowance either way."""
        dt_ms = (to - self.at) * 1000.0
        if dt_ms >= 0:
            return Bounds(to, self.low_ms + dt_ms * (1 - drift), self.high_ms + dt_ms * (1 + drift))
        return Bounds(to, self.low_ms + dt_ms * (1 + drift), self.high_ms + dt_ms * (1 - drift))

    @property
    def width_ms(self) -> float:
        return self.high_ms - self.low_ms

    @property
    def mid_ms(self) -> float:
        return (self.low_ms + self.high_ms) / 2


def sample_bounds(sent: float, received: float, server_ms: int, resolution_ms: int) -> Bounds:
    """What one answer says: its ``Date`` (``server_ms``, truncated to ``resolution_ms``) was
    stamped at some moment between ``sent`` and ``received``, so at ``received`` the store's
    time is at least ``server_ms`` and less than ``server_ms + resolution`` plus the round
    trip."""
    rtt_ms = max(0.0, (received - sent) * 1000.0)
    return Bounds(received, float(server_ms), float(server_ms + resolution_ms) + rtt_ms)


@dataclass(frozen=True)
class Merged:
    """The bounds after an answer; ``jump_ms`` is set when the answer contradicts what was
    known by more than the tolerance: the store's time moved that far (positive: forward)
    against the monotonic clock, and the bounds start again from this answer alone."""

    bounds: Bounds
    jump_ms: float | None = None


def merge(
    known: Bounds | None, sample: Bounds, tolerance_ms: float, drift: float = DRIFT
) -> Merged:
    """Narrow ``known`` by one more answer. Answers that agree narrow the bounds to their
    intersection (so after a few answers at different phases of the store's second the
    bounds are a few milliseconds wide); one that disagrees by at most ``tolerance_ms`` (two
    servers behind one endpoint whose clocks differ a little) replaces them; one that
    disagrees by more is a jump."""
    if known is None:
        return Merged(sample)
    now = known.advanced(sample.at, drift)
    low = max(now.low_ms, sample.low_ms)
    high = min(now.high_ms, sample.high_ms)
    if low <= high:
        return Merged(Bounds(sample.at, low, high))
    gap = (
        sample.low_ms - now.high_ms if sample.low_ms > now.high_ms else sample.high_ms - now.low_ms
    )
    if abs(gap) <= tolerance_ms:
        return Merged(sample)
    return Merged(sample, gap)


def jump_tolerance_ms(fence_margin_s: float) -> float:
    """How far the store's time may disagree with what was known before it counts as a jump:
    half the lease's fence margin, the slack left between a holder's deadline and its
    expiry as peers see it."""
    return fence_margin_s * 1000.0 / 2


def wall_jump_ms(
    previous: tuple[float, float], current: tuple[float, float], tolerance_ms: float
) -> float | None:
    """Whether the wall clock jumped between two readings ``(mono s, wall ms)``: how much
    further it moved than the monotonic clock, when that exceeds ``tolerance_ms``."""
    moved = (current[1] - previous[1]) - (current[0] - previous[0]) * 1000.0
    return moved if abs(moved) > tolerance_ms else None


def expiry_ms(bounds: Bounds | None, sent: float, ttl_s: float, fallback_ms: int) -> int:
    """The ``expires_ms`` a lease written at monotonic time ``sent`` carries: the latest the
    store's time can be at ``sent`` plus the TTL, so that peers, who take the lease as
    expired only once the store's time is surely past it, never do so before the holder's
    monotonic deadline. Without any answer from the store yet, ``fallback_ms`` (wall time)
    stands in."""
    base = bounds.advanced(sent).high_ms if bounds is not None else float(fallback_ms)
    return int(base) + 1 + int(ttl_s * 1000)


def surely_past(bounds: Bounds | None, at: float, deadline_ms: int, fallback_ms: int) -> bool:
    """Whether the store's time at monotonic time ``at`` is surely past ``deadline_ms`` (a
    lease expiry, an alarm's time): its lower bound is. Without any answer from the store
    yet, ``fallback_ms`` (wall time) stands in."""
    low = bounds.advanced(at).low_ms if bounds is not None else float(fallback_ms)
    return low > deadline_ms


def slewed(
    last: tuple[float, float] | None, at: float, estimate: float, slew: float, step_ms: float
) -> float:
    """The runtime clock's next value: the last one carried forward on the monotonic clock,
    moved toward ``estimate`` by at most ``slew`` of the elapsed time (at once when the two
    differ by more than ``step_ms``), never below the last value."""
    if last is None:
        return estimate
    elapsed_ms = max(0.0, (at - last[0]) * 1000.0)
    predicted = last[1] + elapsed_ms
    correction = estimate - predicted
    if abs(correction) > step_ms:
        return max(last[1], estimate)
    allowed = elapsed_ms * slew
    return max(last[1], predicted + max(-allowed, min(allowed, correction)))
