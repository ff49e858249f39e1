"""Node lease decisions (PROTOCOL.md, "Node lease").

Time is passed in: ``now_ms`` is wall time (compared with lease expiries written by other
nodes); ``mono`` is this process's monotonic clock, which anchors the self-fence deadline so
that a wall-clock jump cannot extend it.
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
