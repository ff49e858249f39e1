"""The pure rules of a node's short history (cellactors.core.history): the ring, the
intervals between tallies, percentiles from histogram counts and the fleet's sums."""

from __future__ import annotations

import pytest

from cellactors.core import history
from cellactors.core.history import Ring, Tally

BOUNDS = (0.01, 0.1, 1.0)


def tally(t_ms: int, calls: int, bucket: int = 0, call_hist: tuple[int, ...] = ()) -> Tally:
    hist = call_hist or (0, 0, 0, 0)
    return Tally(t_ms, calls, 0, bucket, hist, (0, 0, 0, 0))


def test_the_ring_keeps_the_last_tallies_and_refuses_going_back_in_time() -> None:
    ring = Ring(kept=3)
    for i in range(6):
        assert ring.add(tally(1000 * i, i))
    assert [t.t_ms for t in ring.tallies()] == [2000, 3000, 4000, 5000]  # kept + 1
    assert not ring.add(tally(5000, 99))
    assert not ring.add(tally(100, 99))
    assert len(ring) == 4 and ring.tallies()[-1].calls == 5


def test_points_count_each_interval_and_survive_a_reset() -> None:
    tallies = [
        tally(0, 10, bucket=4, call_hist=(1, 2, 2, 2)),
        tally(5000, 25, bucket=10, call_hist=(1, 5, 12, 12)),
        tally(10000, 3, bucket=1, call_hist=(0, 1, 1, 1)),  # counters reset (new registry)
    ]
    first, second = history.points(tallies)
    assert (first["t_ms"], first["seconds"], first["calls"], first["bucket"]) == (5000, 5, 15, 6)
    assert first["call_hist"] == [0, 3, 7, 0]  # per bucket, no longer cumulative
    assert (second["calls"], second["bucket"], second["call_hist"]) == (3, 1, [0, 1, 0, 0])


def test_quantiles_interpolate_inside_their_bucket() -> None:
    assert history.quantile(BOUNDS, [0, 0, 0, 0], 0.5) is None
    assert history.quantile(BOUNDS, [0, 10, 0, 0], 0.5) == pytest.approx(0.055)
    assert history.quantile(BOUNDS, [10, 0, 0, 0], 1.0) == pytest.approx(0.01)
    assert history.quantile(BOUNDS, [0, 0, 0, 4], 0.5) == 1.0  # +Inf: the last finite bound
    derived = history.derive(
        {
            "t_ms": 5000,
            "seconds": 5.0,
            "calls": 10,
            "errors": 5,
            "bucket": 20,
            "call_hist": [0, 10, 0, 0],
            "ack_hist": [0, 0, 0, 0],
        },
        BOUNDS,
    )
    assert (derived["calls_per_s"], derived["errors_per_s"], derived["bucket_per_s"]) == (2, 1, 4)
    assert derived["call_p50_ms"] == pytest.approx(55.0)
    assert derived["ack_p99_ms"] is None


def test_merge_adds_up_the_intervals_that_end_in_the_same_step() -> None:
    a = history.points([tally(0, 0), tally(5000, 10, call_hist=(10, 10, 10, 10))])
    b = history.points([tally(0, 0), tally(5000, 30, call_hist=(0, 30, 30, 30)), tally(10000, 31)])
    merged = history.merge([a, b])
    assert [p["t_ms"] for p in merged] == [5000, 10000]
    assert (merged[0]["calls"], merged[0]["nodes"]) == (40, 2)
    assert merged[0]["call_hist"] == [10, 30, 0, 0]
    assert (merged[1]["calls"], merged[1]["nodes"]) == (1, 1)
    assert a[0]["call_hist"] == [10, 0, 0, 0]  # the inputs are left as they were


def test_step_end_is_the_same_instant_on_every_node() -> None:
    assert history.step_end(12_345) == 15_000
    assert history.step_end(15_000) == 20_000
    assert history.step_end(14_999, step_s=1.0) == 15_000
