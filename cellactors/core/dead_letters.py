"""Pure decisions of the outbox's dead letters: when a message that failed to be delivered
is given up (moved to its sender's dead letters) instead of tried again.

A failed delivery is one of three kinds (:class:`Failure`):

- ``FINAL``: the target refused it for good (bad arguments, a key conflict, a cycle, an
  invalid target) or its method raised: trying again cannot help, so it is given up at once;
- ``UNSERVED``: the target serves no such class or method. That may be a typo, or a fleet
  mid-deploy whose nodes do not all run the new code yet, so it is tried again, up to
  ``max_attempts`` such refusals;
- ``TRANSIENT``: the target could not be reached or its outcome is unknown (a node down, a
  takeover, an answer that was not proven durable): tried again, under the message's id as
  idempotency key, until the message is ``max_age_s`` old.

Whatever the kind, a message undelivered for ``max_age_s`` since it was sent (or moved back
by a retry) is given up. Nothing here reads a clock; the caller passes the time in.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Failure(Enum):
    """What one failed delivery says about the next (see the module's docstring)."""

    FINAL = "final"
    UNSERVED = "unserved"
    TRANSIENT = "transient"


@dataclass(frozen=True)
class DeadLetterPolicy:
    """When the outbox gives a message up: after ``max_attempts`` deliveries refused because
    the target serves no such class or method, or once it is ``max_age_s`` old."""

    max_attempts: int = 10
    max_age_s: float = 3600.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, not {self.max_attempts}")
        if not self.max_age_s > 0:
            raise ValueError(f"max_age_s must be positive, not {self.max_age_s}")


def give_up(
    policy: DeadLetterPolicy, failure: Failure, unserved: int, sent_ms: int, now_ms: int
) -> str | None:
    """Why a message whose delivery just failed is given up, or None: try it again later.
    ``unserved`` counts its deliveries refused as ``UNSERVED`` so far, this one included;
    ``sent_ms`` is when it entered the outbox."""
    if failure is Failure.FINAL:
        return "the target refused it for good"
    if failure is Failure.UNSERVED and unserved >= policy.max_attempts:
        return f"the target served no such class or method {unserved} times"
    age_s = (now_ms - sent_ms) / 1000
    if age_s >= policy.max_age_s:
        return f"undelivered for {age_s:.0f} s (the limit is {policy.max_age_s:g} s)"
    return None
