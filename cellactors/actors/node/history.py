"""The node's short history of its figures (:mod:`cellactors.core.history`): a thread that
reads the node's own metrics once per step, at the step's end by the wall clock (so every
node's samples fall on the same instants and the fleet's figures add up), into a ring.

Nothing is counted twice: the tallies are read from the counters and histograms
:class:`~cellactors.actors.metrics.NodeMetrics` already keeps, and from the metered
bucket's own request counts.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from cellactors.actors.metrics import LATENCY_BUCKETS, OK, NodeMetrics
from cellactors.core import history
from cellactors.core.history import Ring, Tally


def _histogram(metric: Any) -> tuple[int, ...]:
    """The cumulative counts of a histogram per upper bound, summed over its labels."""
    by_bound: dict[float, float] = {}
    for family in metric.collect():
        for s in family.samples:
            if s.name.endswith("_bucket"):
                bound = float(s.labels["le"])
                by_bound[bound] = by_bound.get(bound, 0.0) + s.value
    return tuple(int(by_bound.get(b, 0.0)) for b in (*LATENCY_BUCKETS, float("inf")))


def tally(metrics: NodeMetrics, t_ms: int) -> Tally:
    """What ``metrics`` count now, stamped ``t_ms``."""
    calls = errors = 0
    for family in metrics.calls.collect():
        for s in family.samples:
            if s.name.endswith("_total"):
                calls += int(s.value)
                if s.labels.get("outcome") != OK:
                    errors += int(s.value)
    bucket = sum(metrics.bucket.outcomes().values())
    return Tally(
        t_ms=t_ms,
        calls=calls,
        errors=errors,
        bucket=bucket,
        call_hist=_histogram(metrics.call_duration),
        ack_hist=_histogram(metrics.ack_latency),
    )


class History:
    """The ring of one node's tallies and the thread that fills it."""

    def __init__(self, node_id: str, metrics: NodeMetrics, step_s: float = history.STEP_S) -> None:
        self.node_id = node_id
        self.metrics = metrics
        self.step_s = step_s
        self.ring = Ring(max(1, int(history.KEPT * history.STEP_S / step_s)))
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"history-{node_id}", daemon=True)

    def start(self) -> None:
        self.sample(int(time.time() * 1000))  # the baseline: the first interval ends next step
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def sample(self, t_ms: int) -> bool:
        """Add one tally of the metrics now, stamped ``t_ms`` (unless the ring holds a
        later one); whether it was added."""
        with self._lock:
            return self.ring.add(tally(self.metrics, t_ms))

    def view(self) -> dict[str, Any]:
        """The JSON of ``GET /history``: the node, the step, the latency bounds and one
        point per interval, oldest first, with rates and percentiles."""
        with self._lock:
            tallies = self.ring.tallies()
        return {
            "node": self.node_id,
            "step_s": self.step_s,
            "bounds_s": list(LATENCY_BUCKETS),
            "points": [history.derive(p, LATENCY_BUCKETS) for p in history.points(tallies)],
        }

    def _run(self) -> None:
        while True:
            left = self.step_s - (time.time() % self.step_s)
            if self._stop.wait(left):
                return
            # Woken at (or just after) a step's end: stamp it with that end.
            now_ms = int(time.time() * 1000)
            self.sample(history.step_end(now_ms - int(self.step_s * 500), self.step_s))
