"""The store's clock as a node knows it (cellactors.core.store_clock), without a store.

The properties that the lease rests on: the bounds always contain the store's true time,
whatever the answers' timing and truncation, and a peer that judges a lease expired on its
own bounds does so only after the holder's monotonic deadline passed, whatever either
machine's wall clock says (wall clocks are not an input at all)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cellactors.core import lease_rules
from cellactors.core.store_clock import (
    DRIFT,
    Bounds,
    expiry_ms,
    jump_tolerance_ms,
    merge,
    sample_bounds,
    slewed,
    surely_past,
    wall_jump_ms,
)


class Store:
    """A store whose clock reads ``base_ms`` at global time 0 and runs at ``1 + rate``."""

    def __init__(self, base_ms: int, rate: float) -> None:
        self.base_ms = base_ms
        self.rate = rate

    def at(self, t: float) -> float:
        return self.base_ms + t * 1000 * (1 + self.rate)


class Process:
    """A process whose monotonic clock reads ``start`` at global time 0, rate ``1 + rate``;
    it learns the store's time from answers (global send time, round trip, when in the
    round trip the store stamped its Date)."""

    def __init__(self, start: float, rate: float) -> None:
        self.start = start
        self.rate = rate
        self.bounds: Bounds | None = None

    def mono(self, t: float) -> float:
        return self.start + t * (1 + self.rate)

    def ask(self, store: Store, t: float, rtt: float, stamp: float) -> None:
        date = int(store.at(t + rtt * stamp) // 1000 * 1000)  # whole seconds, truncated
        sample = sample_bounds(self.mono(t), self.mono(t + rtt), date, 1000)
        self.bounds = merge(self.bounds, sample, tolerance_ms=100).bounds


rates = st.floats(-DRIFT / 2, DRIFT / 2)
answers = st.lists(
    st.tuples(st.floats(0.0, 5.0), st.floats(0.0, 0.3), st.floats(0.0, 1.0)),
    min_size=1,
    max_size=12,
)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 10**12), rates, rates, answers, st.floats(0.0, 30.0))
def test_bounds_always_contain_the_store_time(
    base: int,
    store_rate: float,
    mono_rate: float,
    asked: list[tuple[float, float, float]],
    later: float,
) -> None:
    store = Store(base, store_rate)
    proc = Process(start=123.0, rate=mono_rate)
    t = 0.0
    for gap, rtt, stamp in asked:
        t += gap
        proc.ask(store, t, rtt, stamp)
        t += rtt
        assert proc.bounds is not None
        assert proc.bounds.low_ms - 1e-6 <= store.at(t) <= proc.bounds.high_ms + 1e-6
    assert proc.bounds is not None
    ahead = proc.bounds.advanced(proc.mono(t + later))
    assert ahead.low_ms - 1e-6 <= store.at(t + later) <= ahead.high_ms + 1e-6


@settings(max_examples=300, deadline=None)
@given(
    st.integers(0, 10**12),
    rates,
    rates,
    rates,
    answers,
    answers,
    st.floats(1.0, 30.0),
    st.floats(0.0, 60.0),
)
def test_a_peer_sees_a_lease_expired_only_after_the_holder_fenced(
    base: int,
    store_rate: float,
    holder_rate: float,
    peer_rate: float,
    holder_answers: list[tuple[float, float, float]],
    peer_answers: list[tuple[float, float, float]],
    ttl: float,
    when: float,
) -> None:
    """The holder writes its expiry from its bounds at the send; the peer judges it on its
    own. Whenever the peer finds it surely past, the holder's monotonic fence deadline has
    passed too: no takeover under a live owner, and no reliance on any wall clock."""
    store = Store(base, store_rate)
    holder, peer = Process(50.0, holder_rate), Process(9_000.0, peer_rate)
    t = 0.0
    for gap, rtt, stamp in holder_answers:
        t += gap
        holder.ask(store, t, rtt, stamp)
        t += rtt
    sent = t
    expires = expiry_ms(holder.bounds, holder.mono(sent), ttl, fallback_ms=0)
    deadline = lease_rules.fence_deadline(holder.mono(sent), ttl)
    u = 0.0
    for gap, rtt, stamp in peer_answers:
        u += gap
        peer.ask(store, u, rtt, stamp)
        u += rtt
    judged_at = max(u, sent) + when
    if surely_past(peer.bounds, peer.mono(judged_at), expires, fallback_ms=0):
        assert lease_rules.should_fence(deadline, holder.mono(judged_at))


def test_an_answer_far_from_the_known_bounds_is_a_jump() -> None:
    known = Bounds(at=10.0, low_ms=1_000_000, high_ms=1_000_050)
    ahead = sample_bounds(12.0, 12.01, 1_007_000, 1000)  # 5 s more than 2 s of mono time
    merged = merge(known, ahead, tolerance_ms=100)
    assert merged.jump_ms is not None and 4_900 < merged.jump_ms < 5_000
    assert merged.bounds == ahead  # the bounds start again from the answer
    behind = sample_bounds(12.0, 12.01, 995_000, 1000)
    back = merge(known, behind, tolerance_ms=100)
    assert back.jump_ms is not None and back.jump_ms < -5_000


def test_a_small_disagreement_replaces_the_bounds_without_a_jump() -> None:
    known = Bounds(at=10.0, low_ms=1_000_000, high_ms=1_000_010)
    near = sample_bounds(10.0, 10.0, 1_000_060, 1)  # 50 ms off: another server's clock
    merged = merge(known, near, tolerance_ms=100)
    assert merged.jump_ms is None and merged.bounds == near


def test_answers_at_different_phases_narrow_the_bounds() -> None:
    """Two answers on either side of the store's second tick pin its phase."""
    first = sample_bounds(0.0, 0.002, 1_000, 1000)  # store time in [1000, 2002) at 0.002
    second = sample_bounds(0.4, 0.402, 2_000, 1000)  # it had ticked by 0.402
    merged = merge(merge(None, first, 100).bounds, second, 100)
    assert merged.jump_ms is None
    assert merged.bounds.width_ms < 610


@pytest.mark.parametrize(
    ("moved_ms", "jump"), [(1_000, None), (15_000 + 1_000, 15_000.0), (1_000 - 3_600_000, -1)]
)
def test_a_wall_clock_that_moves_unlike_the_monotonic_clock_jumped(
    moved_ms: int, jump: float | None
) -> None:
    got = wall_jump_ms((100.0, 5_000_000.0), (101.0, 5_000_000.0 + moved_ms), tolerance_ms=500)
    if jump is None:
        assert got is None
    elif jump > 0:
        assert got == jump
    else:
        assert got is not None and got < -3_500_000


def test_without_answers_the_wall_clock_stands_in() -> None:
    assert expiry_ms(None, 5.0, 10.0, fallback_ms=1_000) == 1_000 + 1 + 10_000
    assert surely_past(None, 5.0, 999, fallback_ms=1_000)
    assert not surely_past(None, 5.0, 1_000, fallback_ms=1_000)


def test_the_jump_tolerance_is_half_the_fence_margin() -> None:
    assert jump_tolerance_ms(lease_rules.fence_margin(10.0)) == 1_000
    assert jump_tolerance_ms(lease_rules.fence_margin(3.0)) == 500  # margin: 1 s
    assert jump_tolerance_ms(lease_rules.fence_margin(2.0)) == pytest.approx(1000 / 3)


# --- the runtime clock's slew --------------------------------------------------------------


def test_a_correction_is_absorbed_gradually_so_a_delay_is_never_cut_short() -> None:
    # The estimate moved 400 ms forward (answers narrowed the bounds): the clock follows at
    # 5% of elapsed time, so 200 ms on it last at least 200 / 1.05 real milliseconds.
    last = (10.0, 1_000_000.0)
    value = slewed(last, 10.2, 1_000_600.0, 0.05, 2000.0)
    assert value == pytest.approx(1_000_000.0 + 200 * 1.05)


def test_a_backward_correction_slows_the_clock_but_never_moves_it_back() -> None:
    last = (10.0, 1_000_000.0)
    assert slewed(last, 10.2, 999_000.0, 0.05, 2000.0) == pytest.approx(1_000_000.0 + 200 * 0.95)
    assert slewed(last, 10.0, 999_000.0, 0.05, 2000.0) == 1_000_000.0


def test_a_correction_larger_than_a_step_is_taken_at_once_forward_never_backward() -> None:
    last = (10.0, 1_000_000.0)
    assert slewed(last, 10.1, 1_010_000.0, 0.05, 2000.0) == 1_010_000.0
    assert slewed(last, 10.1, 990_000.0, 0.05, 2000.0) == 1_000_000.0
    assert slewed(None, 10.1, 990_000.0, 0.05, 2000.0) == 990_000.0


@given(st.lists(st.tuples(st.floats(0, 5), st.floats(-3000, 3000)), min_size=1, max_size=30))
def test_the_runtime_clock_never_runs_back_nor_slower_than_it_may(
    steps: list[tuple[float, float]],
) -> None:
    at, value = 0.0, 1_000_000.0
    last = (at, value)
    for dt, error in steps:
        at += dt
        nxt = slewed(last, at, at * 1000 + 1_000_000.0 + error, 0.05, 2000.0)
        assert nxt >= last[1]
        if abs(at * 1000 + 1_000_000.0 + error - (last[1] + dt * 1000)) <= 2000.0:
            assert nxt >= last[1] + dt * 1000 * 0.95 - 1e-6
            assert nxt <= last[1] + dt * 1000 * 1.05 + 1e-6
        last = (at, nxt)
