"""Pure decisions of the Python client's retries: which failed attempt may be tried again,
how long to wait first, and when to give up.

A call is retried across the fleet's URLs until ``retry_for`` seconds have passed since its
first attempt started (long enough by default to ride out a node's crash: its lease TTL,
10 s by default, then the takeover), optionally also capped by ``max_attempts``. The waits
grow exponentially with jitter up to ``max_backoff``, except while the first pass over the
URLs is still trying a node that could not be reached: the next node may well answer.
Nothing here reads a clock or draws a random number; the caller passes both in.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The outcome names of :mod:`cellactors.errors` (repeated: core imports no other layer).
NOT_RUN, UNKNOWN = "not_run", "unknown"


@dataclass(frozen=True)
class RetryPolicy:
    """How long a client keeps trying one logical call (or one stretch of a feed).

    ``retry_for``: seconds after the first attempt started during which another attempt may
    start (0: never retry); an attempt that started in time runs to its own timeout.
    ``max_attempts``: an optional extra cap on attempts (None: only the deadline counts).
    ``backoff``: the first wait in seconds, doubling per attempt up to ``max_backoff``."""

    retry_for: float = 30.0
    max_attempts: int | None = None
    backoff: float = 0.1
    max_backoff: float = 2.0

    def __post_init__(self) -> None:
        if not self.retry_for >= 0:
            raise ValueError(f"retry_for must be at least 0 seconds, not {self.retry_for}")
        if self.max_attempts is not None and self.max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, not {self.max_attempts}")
        if not (self.backoff >= 0 and self.max_backoff >= self.backoff):
            raise ValueError("backoff must be at least 0 and at most max_backoff")


def may_retry(outcome: str, retryable: bool, keyed: bool) -> bool:
    """Whether a failed attempt may be sent again: a transient ``not_run`` error always (it
    ran nowhere); an ``unknown`` outcome only under an idempotency key (the cell runs a
    keyed call at most once); a ``failed`` outcome or another ``not_run`` error never."""
    if outcome == NOT_RUN:
        return retryable
    return outcome == UNKNOWN and keyed


def next_wait(
    policy: RetryPolicy, attempts: int, elapsed: float, first_pass: bool, jitter: float
) -> float | None:
    """Seconds to wait before the next attempt, or None: give up.

    ``attempts`` made so far (1 after the first), ``elapsed`` seconds since the first one
    started; ``first_pass``: the last attempt could not reach its node and not every URL was
    tried yet (no wait then); ``jitter`` in [0, 1) scales a wait to between half and all of
    it, so clients failing together do not retry in lockstep. A wait never runs past the
    deadline: the last attempt starts at it at the latest."""
    if policy.max_attempts is not None and attempts >= policy.max_attempts:
        return None
    remaining = policy.retry_for - elapsed
    if remaining <= 0:
        return None
    if first_pass:
        return 0.0
    delay = min(policy.max_backoff, policy.backoff * 2.0 ** min(32, max(0, attempts - 1)))
    return min(remaining, delay * (0.5 + jitter / 2))
