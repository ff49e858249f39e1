"""Node metrics in Prometheus text format, without a client library."""

from __future__ import annotations

import threading

from cellactors.persistence.metered import MeteredBucket

_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Counter:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.value = 0

    def inc(self, by: int = 1) -> None:
        with self._lock:
            self.value += by


class Histogram:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts = [0] * len(_BUCKETS)
        self.total = 0.0
        self.n = 0

    def observe(self, seconds: float) -> None:
        with self._lock:
            self.n += 1
            self.total += seconds
            for i, bound in enumerate(_BUCKETS):
                if seconds <= bound:
                    self.counts[i] += 1


class NodeMetrics:
    """Calls, acknowledgements with latency, and bucket requests by kind."""

    def __init__(self, bucket: MeteredBucket) -> None:
        self.bucket = bucket
        self.calls = Counter()
        self.acks = Histogram()

    def render(self, node: str, resident: int, uploads_in_flight: int) -> str:
        lbl = f'node="{node}"'
        lines = [
            "# TYPE cellactors_calls_total counter",
            f"cellactors_calls_total{{{lbl}}} {self.calls.value}",
            "# TYPE cellactors_acks_total counter",
            f"cellactors_acks_total{{{lbl}}} {self.acks.n}",
            "# TYPE cellactors_ack_latency_seconds histogram",
        ]
        for bound, count in zip(_BUCKETS, self.acks.counts, strict=True):
            lines.append(f'cellactors_ack_latency_seconds_bucket{{{lbl},le="{bound}"}} {count}')
        lines += [
            f'cellactors_ack_latency_seconds_bucket{{{lbl},le="+Inf"}} {self.acks.n}',
            f"cellactors_ack_latency_seconds_sum{{{lbl}}} {self.acks.total:.6f}",
            f"cellactors_ack_latency_seconds_count{{{lbl}}} {self.acks.n}",
            "# TYPE cellactors_bucket_requests_total counter",
        ]
        for (op, kind), count in sorted(self.bucket.snapshot().items()):
            lines.append(
                f'cellactors_bucket_requests_total{{{lbl},op="{op}",kind="{kind}"}} {count}'
            )
        lines += [
            "# TYPE cellactors_resident_cells gauge",
            f"cellactors_resident_cells{{{lbl}}} {resident}",
            "# TYPE cellactors_uploads_in_flight gauge",
            f"cellactors_uploads_in_flight{{{lbl}}} {uploads_in_flight}",
        ]
        return "\n".join(lines) + "\n"
