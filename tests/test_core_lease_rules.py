"""Tests of :mod:`cellactors.core.lease_rules` (docs/protocol.md, "Node lease and self-fence")."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cellactors.core.lease_rules import (
    Adopt,
    Fence,
    WaitForExpiry,
    Write,
    clock_excess_ms,
    decide_start,
    fence_deadline,
    fence_margin,
    holder_is_live,
    reconcile,
    renew_interval,
    retry_delay,
    should_fence,
)
from cellactors.persistence.control.leases import LeaseSnapshot, NodeLease
from cellactors.persistence.store.bucket import Absent, Match

NOW = 5_000_000


def snap(generation: str, expires_ms: int, addr: str = "http://n1") -> LeaseSnapshot:
    lease = NodeLease(node="n1", addr=addr, expires_ms=expires_ms, generation=generation)
    return LeaseSnapshot(lease, token="tok")


@pytest.mark.parametrize(
    ("current", "expected"),
    [
        pytest.param(None, Write(Absent()), id="absent"),
        pytest.param(snap("mine", NOW + 9_000), Write(Match("tok")), id="ours and live"),
        pytest.param(snap("mine", NOW - 9_000), Write(Match("tok")), id="ours and expired"),
        pytest.param(snap("old", NOW - 1), Write(Match("tok")), id="other generation expired"),
        pytest.param(snap("old", NOW), Write(Match("tok")), id="expires exactly now"),
        pytest.param(snap("old", 0), Write(Match("tok")), id="gracefully stopped"),
        pytest.param(
            snap("old", NOW + 1), WaitForExpiry("old", NOW + 1), id="other generation live"
        ),
        pytest.param(
            snap("old", NOW + 9_000), WaitForExpiry("old", NOW + 9_000), id="live for long"
        ),
    ],
)
def test_decide_start(current: LeaseSnapshot | None, expected: object) -> None:
    assert decide_start(current, "mine", NOW) == expected


def test_decide_start_agrees_with_is_live() -> None:
    """A peer treats the lease as dead exactly when a restart may take it over."""
    for expires in range(NOW - 3, NOW + 4):
        current = snap("old", expires)
        waits = isinstance(decide_start(current, "mine", NOW), WaitForExpiry)
        assert waits == current.lease.is_live(NOW)


@pytest.mark.parametrize("ttl", [0.3, 1.0, 3.0, 5.0, 10.0, 30.0, 120.0])
def test_fence_deadline_table(ttl: float) -> None:
    sent = 1234.5
    deadline = fence_deadline(sent, ttl)
    # The node fences strictly before the lease it wrote could expire for anyone else...
    assert deadline < sent + ttl
    # ...but only after at least one more renewal had a chance to run.
    assert deadline > sent + renew_interval(ttl)
    assert fence_margin(ttl) > 0
    assert not should_fence(deadline, deadline - 1e-6)
    assert should_fence(deadline, deadline)
    assert should_fence(deadline, sent + ttl)


def test_default_ttl_numbers() -> None:
    assert renew_interval(10.0) == pytest.approx(10.0 / 3)
    assert fence_deadline(0.0, 10.0) == pytest.approx(8.0)


@settings(max_examples=300, deadline=None)
@given(
    st.floats(min_value=0.0, max_value=1e6, allow_nan=False),
    st.floats(min_value=0.05, max_value=3600.0, allow_nan=False),
)
def test_fence_deadline_before_expiry(sent: float, ttl: float) -> None:
    deadline = fence_deadline(sent, ttl)
    assert sent + renew_interval(ttl) < deadline < sent + ttl


# --- reconciling renewals, backoff, clocks ---------------------------------------------------


@pytest.mark.parametrize(
    ("current", "attempts", "expected"),
    [
        pytest.param(None, {}, Write(Absent()), id="record gone: create it again"),
        pytest.param(
            snap("thief", NOW + 9_000),
            {NOW + 9_000: 1.0},
            Fence("another process (generation thief) took this node identity"),
            id="another generation fences",
        ),
        pytest.param(
            snap("mine", NOW + 9_000), {NOW + 9_000: 7.5}, Adopt("tok", 7.5), id="our attempt"
        ),
        pytest.param(
            snap("mine", NOW + 1_000),
            {NOW + 9_000: 7.5},
            Adopt("tok", None),
            id="an older write of ours: token only",
        ),
        pytest.param(snap("mine", NOW), {}, Adopt("tok", None), id="stale token after a lost ack"),
    ],
)
def test_reconcile(
    current: LeaseSnapshot | None, attempts: dict[int, float], expected: object
) -> None:
    assert reconcile(current, "mine", attempts) == expected


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 40), st.floats(0.1, 10.0), st.floats(0.0, 0.999))
def test_retry_delay_is_capped_exponential_with_jitter(
    failures: int, cap: float, jitter: float
) -> None:
    delay = retry_delay(failures, cap, jitter)
    base = min(cap, 0.1 * 2**failures)
    assert base / 2 <= delay <= base
    assert retry_delay(failures + 1, cap, jitter) >= delay  # never shrinks as failures grow


@pytest.mark.parametrize(
    ("bounds", "bound", "excess"),
    [
        pytest.param((-990, 10), 750, None, id="in sync"),
        pytest.param((4_000, 5_010), 750, 4_000, id="5 s ahead"),
        pytest.param((-5_990, -4_990), 750, -4_990, id="5 s behind"),
        pytest.param((700, 1_710), 750, None, id="maybe within"),
    ],
)
def test_clock_excess(bounds: tuple[int, int], bound: int, excess: int | None) -> None:
    assert clock_excess_ms(bounds, bound) == excess


def test_a_holder_is_live_once_its_lease_was_written_again() -> None:
    first = WaitForExpiry("old", NOW + 2_000)
    assert not holder_is_live(first, WaitForExpiry("old", NOW + 2_000))  # crashed: unchanged
    assert holder_is_live(first, WaitForExpiry("old", NOW + 2_700))  # renewed
    assert holder_is_live(first, WaitForExpiry("newer", NOW + 2_000))  # taken by another
