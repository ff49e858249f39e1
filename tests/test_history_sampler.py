"""A node's history sampler (cellactors.actors.node.history): tallies read from the node's
own metrics, and the thread that takes one at every step's end by the wall clock."""

from __future__ import annotations

import itertools
import threading
import time

from cellactors.actors.metrics import NodeMetrics, NodeSample
from cellactors.actors.node.history import History, tally
from cellactors.persistence.store.memory import MemoryBucket
from cellactors.persistence.store.metered import MeteredBucket


def metrics() -> NodeMetrics:
    return NodeMetrics(
        MeteredBucket(MemoryBucket()), lambda: NodeSample("n", "g", "serving", 0, 0, 0)
    )


def test_a_tally_reads_what_the_metrics_count() -> None:
    m = metrics()
    for outcome in ("ok", "ok", "failed"):
        m.call_done("C", "m", outcome)
    m.call_done("D", "m", "ok")
    m.call_answered("C", 0.007)  # between the 5 ms and 10 ms bounds
    m.call_answered("D", 2.0)
    m.ack_latency.observe(0.001)
    m.bucket.get("cells/C:x/own.json")
    t = tally(m, 1234)
    assert (t.t_ms, t.calls, t.errors, t.bucket) == (1234, 4, 1, 1)
    assert t.call_hist[:2] == (0, 1) and t.call_hist[-1] == 2  # cumulative, summed over C, D
    assert t.ack_hist[0] == 1


def test_the_thread_samples_at_every_step_end_until_stopped() -> None:
    m = metrics()
    history = History("n", m, step_s=0.2)
    history.start()
    try:
        deadline = time.monotonic() + 10
        pace = threading.Event()  # never set: its timeout paces the calls; the loop polls
        while len(history.ring) < 4 and time.monotonic() < deadline:
            m.call_done("C", "m", "ok")
            pace.wait(0.01)
        stamps = [t.t_ms for t in history.ring.tallies()]
        assert len(stamps) >= 4
        assert all(s % 200 == 0 for s in stamps[1:])  # step ends, the same on every node
        # One step apart, or several when the thread woke late on a busy machine.
        assert all(b > a and (b - a) % 200 == 0 for a, b in itertools.pairwise(stamps[1:]))
        points = history.view()["points"]
        assert sum(p["calls"] for p in points) == history.ring.tallies()[-1].calls
    finally:
        history.stop()
    history._thread.join(timeout=5)
    assert not history._thread.is_alive()
