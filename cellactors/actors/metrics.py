"""Node metrics with prometheus-client, one :class:`CollectorRegistry` per node.

Several nodes may live in one process (the tests do this), so nothing is registered in the
library's global registry. Events are counted where they happen (calls, activations,
fences, lease renewals, acknowledgements); values the node already keeps (bucket requests,
resident cells, unacknowledged transactions) are read when scraped, so the exposition can
never drift from the node's own accounting.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from cellactors.errors import FAILED, NOT_RUN, UNKNOWN
from cellactors.persistence.store.metered import MeteredBucket

#: Histogram buckets in seconds (acknowledgement and call latency).
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
#: The ``outcome`` label of ``cellactors_calls_total``: answered, or the error's outcome class.
OK = "ok"
CALL_OUTCOMES = (OK, NOT_RUN, UNKNOWN, FAILED)
#: Label value for a class or method the node does not serve (bounded label cardinality).
UNSERVED = "_unserved_"
#: The node statuses ``cellactors_node_status`` reports, one series each.
STATUSES = ("starting", "serving", "draining", "fenced", "stopped")
#: The exposition's content type (text format 0.0.4).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: The ``listener`` and ``limit`` labels of ``cellactors_wire_refusals_total`` (the limits
#: of cellactors.server.wire_limits), every pair exposed from the start, at 0.
WIRE_LISTENERS = ("public", "internal")
WIRE_LIMITS = (
    "header_bytes",
    "header_count",
    "header_timeout",
    "body_timeout",
    "idle_timeout",
    "connections",
)


@dataclass(frozen=True)
class NodeSample:
    """Gauges read from the node at scrape time."""

    node: str
    generation: str
    status: str
    resident_cells: int
    unacked_transactions: int
    uploads_in_flight: int
    hibernated_cells: int = 0
    storage_degraded: bool = False


class _NodeCollector(Collector):
    """Collects, at scrape time, what the node and its metered bucket already count."""

    def __init__(self, bucket: MeteredBucket, sample: Callable[[], NodeSample]) -> None:
        self.bucket = bucket
        self.sample = sample

    def collect(self) -> Iterator[Metric]:
        s = self.sample()
        info = GaugeMetricFamily(
            "cellactors_node_info",
            "This node's identity: always 1, labelled with node id and process generation.",
            labels=["node", "generation"],
        )
        info.add_metric([s.node, s.generation], 1)
        yield info
        status = GaugeMetricFamily(
            "cellactors_node_status",
            "1 for the node's current status, 0 for the others.",
            labels=["status"],
        )
        for name in STATUSES:
            status.add_metric([name], 1 if s.status == name else 0)
        yield status
        yield GaugeMetricFamily(
            "cellactors_resident_cells", "Cells active on this node.", value=s.resident_cells
        )
        yield GaugeMetricFamily(
            "cellactors_hibernated_cells",
            "Cells this node owns with nothing running (resumed with no bucket request).",
            value=s.hibernated_cells,
        )
        yield GaugeMetricFamily(
            "cellactors_storage_degraded",
            "1 while this node's local storage is failing (it takes no new cells), else 0.",
            value=1 if s.storage_degraded else 0,
        )
        yield GaugeMetricFamily(
            "cellactors_unacked_transactions",
            "Committed transactions of resident cells not yet proven durable in the bucket.",
            value=s.unacked_transactions,
        )
        yield GaugeMetricFamily(
            "cellactors_uploads_in_flight",
            "Resident cells with transactions unshipped or unacknowledged.",
            value=s.uploads_in_flight,
        )
        requests = CounterMetricFamily(
            "cellactors_bucket_requests",
            "Bucket requests finished, by operation, key kind and outcome "
            "(ok, absent, rejected, ambiguous, error).",
            labels=["op", "kind", "outcome"],
        )
        for (op, kind, outcome), count in sorted(self.bucket.outcomes().items()):
            requests.add_metric([op, kind, outcome], count)
        yield requests


class NodeMetrics:
    """The metrics of one node, in a registry of its own."""

    def __init__(self, bucket: MeteredBucket, sample: Callable[[], NodeSample]) -> None:
        self.bucket = bucket
        self.registry = CollectorRegistry()
        # Labelled children of the per-call metrics, looked up once per label set: every
        # call counts itself, and ``labels()`` takes a lock and builds its key each time.
        self._call_counts: dict[tuple[str, str, str], Counter] = {}
        self._call_durations: dict[str, Histogram] = {}
        r = self.registry
        self.calls = Counter(
            "cellactors_calls",
            "Calls that reached this node's runtime, by class, method and outcome "
            "(ok, not_run, unknown, failed).",
            ["class", "method", "outcome"],
            registry=r,
        )
        self.forwarded = Counter(
            "cellactors_calls_routed_away",
            "Calls this node found owned by a live peer (counted there, forwarded by the "
            "public listener).",
            ["class"],
            registry=r,
        )
        self.call_duration = Histogram(
            "cellactors_call_duration_seconds",
            "Time from a call reaching the runtime to its answer, for calls answered ok.",
            ["class"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.ack_latency = Histogram(
            "cellactors_ack_latency_seconds",
            "Time from a transaction's commit to its acknowledgement (durable in the bucket).",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.activations = Counter(
            "cellactors_activations",
            "Cell activations on this node, by class and where the state came from "
            "(bucket or local).",
            ["class", "source"],
            registry=r,
        )
        self.fences = Counter(
            "cellactors_fences", "Self-fences of this node process (0 or 1).", registry=r
        )
        self.lease_renewals = Counter(
            "cellactors_lease_renewals",
            "Confirmed writes of this node's lease: the first take, every renewal, and the "
            "expiry written by a drain.",
            registry=r,
        )
        self.clock_jumps = Counter(
            "cellactors_clock_jumps",
            "Jumps seen of this machine's wall clock (clock=wall: logged, nothing depends on "
            "it) and of the store's clock against this machine's monotonic clock "
            "(clock=store: leases are not judged for a TTL; a forward jump fences the node).",
            ["clock"],
            registry=r,
        )
        self.alarms = Counter(
            "cellactors_alarm_runs",
            "Runs of on_alarm on this node, by result: fired (committed), retry (raised, "
            "rescheduled with backoff), abandoned (raised for the last allowed time).",
            ["class", "result"],
            registry=r,
        )
        self.wake_scans = Counter(
            "cellactors_wake_scans",
            "Scans of the bucket's due wake entries (one LIST each, plus one per further "
            "page of due entries).",
            registry=r,
        )
        self.outbox = Counter(
            "cellactors_outbox_messages",
            "Outbox messages this node delivered, by result: delivered, retried (a delivery "
            "failed; tried again later), dead_lettered (given up: moved to the sender's dead "
            "letters).",
            ["result"],
            registry=r,
        )
        self.storage_faults = Counter(
            "cellactors_storage_faults",
            "Faults of this node's local storage met by calls and activations (disk full, "
            "I/O error, read-only or unopenable file): each answered storage_unavailable.",
            registry=r,
        )
        self.wire_refusals = Counter(
            "cellactors_wire_refusals",
            "Connections a listener cut off or refused at a limit on the wire, by listener "
            "(public, internal) and limit (header_bytes, header_count: answered 431; "
            "header_timeout, body_timeout: 408 or closed; idle_timeout: an idle connection "
            "closed; connections: over the cap, answered 503).",
            ["listener", "limit"],
            registry=r,
        )
        self._wire_refusals = {
            (listener, limit): self.wire_refusals.labels(listener, limit)
            for listener in WIRE_LISTENERS
            for limit in WIRE_LIMITS
        }
        self.feed_streams_refused = Counter(
            "cellactors_feed_streams_refused",
            "Change feed follow streams (wait > 0) this node refused with feed_unavailable "
            "because it already served max_feed_streams of them.",
            registry=r,
        )
        r.register(_NodeCollector(bucket, sample))

    def wire_refused(self, listener: str, limit: str) -> None:
        """Count one connection a listener cut off or refused at ``limit`` (one of
        :data:`WIRE_LIMITS`: every pair exists from the start)."""
        self._wire_refusals[(listener, limit)].inc()

    def call_done(self, cls_name: str, method: str, outcome: str) -> None:
        """Count one call by its outcome (``ok`` or an error's outcome class)."""
        key = (cls_name, method, outcome)
        child = self._call_counts.get(key)
        if child is None:
            child = self._call_counts[key] = self.calls.labels(*key)
        child.inc()

    def call_answered(self, cls_name: str, seconds: float) -> None:
        """Observe the duration of one call answered ok."""
        child = self._call_durations.get(cls_name)
        if child is None:
            child = self._call_durations[cls_name] = self.call_duration.labels(cls_name)
        child.observe(seconds)

    def render(self) -> bytes:
        """The Prometheus text exposition of this node's registry."""
        return generate_latest(self.registry)
