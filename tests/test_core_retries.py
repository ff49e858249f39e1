"""The client's retry decisions (cellactors.core.retries), without a clock or a network."""

from __future__ import annotations

import pytest

from cellactors.core.retries import RetryPolicy, may_retry, next_wait


@pytest.mark.parametrize(
    ("outcome", "retryable", "keyed", "expected"),
    [
        ("not_run", True, False, True),  # ran nowhere: always
        ("not_run", False, True, False),  # a refusal for good (bad_request, key_conflict)
        ("unknown", False, True, True),  # may have run: safe only under its key
        ("unknown", False, False, False),
        ("failed", False, True, False),  # ran and rolled back: a retry runs it again
    ],
)
def test_may_retry(outcome: str, retryable: bool, keyed: bool, expected: bool) -> None:
    assert may_retry(outcome, retryable, keyed) is expected


def test_waits_double_up_to_the_cap_with_jitter() -> None:
    policy = RetryPolicy(retry_for=1000.0, backoff=0.1, max_backoff=2.0)
    full = [next_wait(policy, n, 0.0, False, 0.999999) for n in range(1, 8)]
    assert full == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0], rel=1e-5)
    assert next_wait(policy, 3, 0.0, False, 0.0) == pytest.approx(0.2)  # half, at least
    assert next_wait(policy, 10_000, 0.0, False, 0.5) == pytest.approx(1.5)  # no overflow


def test_no_wait_on_the_first_pass_over_unreachable_nodes() -> None:
    assert next_wait(RetryPolicy(), 1, 0.0, True, 0.7) == 0.0


def test_the_deadline_ends_the_retries_and_bounds_the_last_wait() -> None:
    policy = RetryPolicy(retry_for=10.0, backoff=1.0, max_backoff=4.0)
    assert next_wait(policy, 5, 9.5, False, 0.999) == pytest.approx(0.5)  # start at 10.0
    assert next_wait(policy, 5, 10.0, False, 0.5) is None
    assert next_wait(policy, 1, 10.0, True, 0.5) is None  # even on the first pass
    assert next_wait(RetryPolicy(retry_for=0.0), 1, 0.0, True, 0.5) is None


def test_max_attempts_is_an_extra_cap() -> None:
    policy = RetryPolicy(retry_for=30.0, max_attempts=3)
    assert next_wait(policy, 2, 0.0, False, 0.5) is not None
    assert next_wait(policy, 3, 0.0, False, 0.5) is None
    assert next_wait(RetryPolicy(retry_for=30.0), 500, 1.0, False, 0.5) is not None


@pytest.mark.parametrize(
    "kwargs",
    [{"retry_for": -1.0}, {"max_attempts": 0}, {"backoff": -0.1}, {"backoff": 3.0}],
)
def test_bad_policies_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]
