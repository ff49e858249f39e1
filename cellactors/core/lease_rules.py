"""Node lease decisions (docs/protocol.md, "Node lease and self-fence").

Time is passed in: ``now_ms`` is the store's time, surely reached (compared with lease
expiries, which are written in store time: :mod:`cellactors.core.store_clock`); ``mono`` is
this process's monotonic clock, which anchors the self-fence deadline so that a wall-clock
jump cannot extend it.
"""

from __future__ import annotations

from dataclasses import dataclass

from cellactors.core.types import Absent, Guard, LeaseSnapshot, Match


@dataclass(frozen=True)
class Write:
    """Write our lease with this guard."""

    guard: Guard


@dataclass(frozen=True)
class WaitForExpiry:
    """Another live process holds this node identity; wait until ``expires_ms``."""

    holder_generation: str
    expires_ms: int


StartDecision = Write | WaitForExpiry


def decide_start(current: LeaseSnapshot | None, generation: str, now_ms: int) -> StartDecision:
    """How to take our node identity at start."""
    if current is None:
        return Write(Absent())
    lease = current.lease
    if lease.generation == generation or lease.expires_ms <= now_ms:
        return Write(Match(current.token))
    return WaitForExpiry(lease.generation, lease.expires_ms)


def holder_is_live(first: WaitForExpiry, now: WaitForExpiry) -> bool:
    """Whether the lease seen while waiting proves its holder alive: it was written again
    (renewed, or taken by yet another process) since the first look. A crashed holder's
    lease never changes: only then is waiting for its expiry worth it."""
    return now != first


def renew_interval(ttl_s: float) -> float:
    return ttl_s / 3.0


def fence_margin(ttl_s: float) -> float:
    """Fence this long before the lease we last wrote could expire for others."""
    return max(ttl_s / 5.0, min(1.0, ttl_s / 3.0))


def fence_deadline(sent_mono: float, ttl_s: float) -> float:
    """Monotonic time by which another renewal must succeed, given that the last successful
    one was *sent* at ``sent_mono``. Its expiry was computed from a wall-clock read taken
    just after ``sent_mono``, so the local deadline never outlasts the lease others see."""
    return sent_mono + ttl_s - fence_margin(ttl_s)


def should_fence(deadline_mono: float, mono: float) -> bool:
    return mono >= deadline_mono


# --- reconciling a renewal that did not plainly apply -----------------------------------


@dataclass(frozen=True)
class Adopt:
    """The record in the bucket is this process's: continue from its token. ``sent_mono`` is
    when the attempt that wrote it was sent (None when it is an older write of ours): only a
    known attempt may extend the fence deadline."""

    token: str
    sent_mono: float | None


@dataclass(frozen=True)
class Fence:
    """Another process holds this node identity now: fence at once."""

    reason: str


RenewalDecision = Adopt | Fence | Write


def reconcile(
    current: LeaseSnapshot | None, generation: str, attempts: dict[int, float]
) -> RenewalDecision:
    """After a renewal was rejected (412) or its outcome is unknown (5xx, timeout, reset),
    decide from a fresh read of the lease. ``attempts`` maps the ``expires_ms`` of each
    write sent since the last confirmed one to its monotonic send time.

    Only a record naming another process generation fences: a 412 caused by our own earlier
    write that applied unseen (a stale token) is adopted, not mistaken for a takeover."""
    if current is None:
        return Write(Absent())
    if current.lease.generation != generation:
        return Fence(
            f"another process (generation {current.lease.generation}) took this node identity"
        )
    return Adopt(current.token, attempts.get(current.lease.expires_ms))


def retry_delay(failures: int, cap_s: float, jitter: float) -> float:
    """Capped exponential backoff between failed lease writes: 0.1 s doubling per failure,
    at most ``cap_s``, scaled by ``jitter`` in [0, 1) to between half and all of it (so a
    fleet hit by one store outage does not retry in lockstep)."""
    base = min(cap_s, 0.1 * 2.0 ** min(failures, 16))
    return float(base * (0.5 + jitter / 2))


# --- clocks -------------------------------------------------------------------------------


def clock_excess_ms(bounds: tuple[int, int], max_skew_ms: int) -> int | None:
    """The offset, given as bounds (low, high) of this machine's wall clock minus the store's,
    when it is *certainly* beyond ``max_skew_ms`` (either way), else None."""
    low, high = bounds
    if low > max_skew_ms:
        return low
    if high < -max_skew_ms:
        return high
    return None
