"""When the outbox gives a message up (cellactors.core.dead_letters), without a clock."""

from __future__ import annotations

import pytest

from cellactors.core.dead_letters import DeadLetterPolicy, Failure, give_up

POLICY = DeadLetterPolicy(max_attempts=3, max_age_s=60.0)
SENT = 1_000_000


def test_a_final_failure_is_given_up_at_once() -> None:
    assert give_up(POLICY, Failure.FINAL, 0, SENT, SENT) == "the target refused it for good"


def test_unserved_refusals_count_up_to_max_attempts() -> None:
    assert give_up(POLICY, Failure.UNSERVED, 2, SENT, SENT + 1000) is None
    reason = give_up(POLICY, Failure.UNSERVED, 3, SENT, SENT + 1000)
    assert reason is not None and "3 times" in reason


def test_transient_failures_are_bounded_by_age_only() -> None:
    assert give_up(POLICY, Failure.TRANSIENT, 0, SENT, SENT + 59_999) is None
    reason = give_up(POLICY, Failure.TRANSIENT, 0, SENT, SENT + 60_000)
    assert reason is not None and "undelivered for 60 s" in reason
    assert give_up(POLICY, Failure.UNSERVED, 1, SENT, SENT + 60_000) is not None  # any kind


@pytest.mark.parametrize("kwargs", [{"max_attempts": 0}, {"max_age_s": 0.0}])
def test_bad_policies_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        DeadLetterPolicy(**kwargs)  # type: ignore[arg-type]
