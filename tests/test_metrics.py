"""Node metrics through prometheus-client: ``/metrics`` scraped from a served node on a real
SeaweedFS bucket and parsed with prometheus-client's own parser; exact where the runtime is
exact (calls, batch PUTs, owner re-reads, acknowledged transactions)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import prometheus_client
import pytest

from cellactors.actors.metrics import UNSERVED
from cellactors.core.types import Absent, Match
from cellactors.errors import UnknownCell
from cellactors.persistence.store.memory import MemoryBucket
from cellactors.persistence.store.metered import MeteredBucket
from cellactors.persistence.store.s3 import S3Bucket
from tests.helpers.metrics import Samples, parse, value
from tests.helpers.runtime import make_node
from tests.helpers.served import ServedNode, served_node


def scrape(http: httpx.Client, served: ServedNode) -> Samples:
    answer = http.get(served.internal + "/metrics")
    assert answer.status_code == 200
    assert answer.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    return parse(answer.text)


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=30) as client:
        yield client


def increment(http: httpx.Client, served: ServedNode, cell: str) -> httpx.Response:
    return http.post(f"{served.public}/cells/Counter/{cell}/increment", json={"name": "x"})


def test_scraped_metrics_count_calls_batches_and_acks_exactly(
    sw_bucket: S3Bucket, http: httpx.Client
) -> None:
    with served_node(sw_bucket, "m1") as served:
        assert increment(http, served, "a").json() == {"result": 1}  # activation, schema
        before = scrape(http, served)
        for n in range(2, 7):
            assert increment(http, served, "a").json() == {"result": n}
        failed = http.post(f"{served.public}/cells/Counter/a/fail_after_write", json={"name": "x"})
        assert failed.status_code == 422
        with pytest.raises(UnknownCell):
            served.node.call("Counter", "a", "no_such_method", {})
        renewals_before = served.node.lease.proxy().renewals.get()
        after = scrape(http, served)
        renewals_after = served.node.lease.proxy().renewals.get()
        state = http.get(served.internal + "/state").json()

    calls = "cellactors_calls_total"
    assert value(after, calls, **{"class": "Counter", "method": "increment", "outcome": "ok"}) == 6
    assert (
        value(
            after, calls, **{"class": "Counter", "method": "fail_after_write", "outcome": "failed"}
        )
        == 1
    )
    assert (
        value(after, calls, **{"class": "Counter", "method": UNSERVED, "outcome": "not_run"}) == 1
    )
    total = sum(v for (name, _), v in after.items() if name == calls)
    assert total == 8
    assert value(after, "cellactors_call_duration_seconds_count", **{"class": "Counter"}) == 6

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    # Five lone writes: one batch PUT and one owner re-read each; the failed call wrote nothing.
    bucket = "cellactors_bucket_requests_total"
    assert delta(bucket, op="put", kind="batch", outcome="ok") == 5
    assert delta(bucket, op="get", kind="own", outcome="ok") == 5
    assert delta("cellactors_ack_latency_seconds_count") == 5
    # Every transaction of this activation (schema included) was acknowledged exactly once.
    (cell,) = state["cells"]
    assert cell["cell"] == "Counter:a" and cell["unacked"] == 0
    assert value(after, "cellactors_ack_latency_seconds_count") == cell["acked_txid"]
    assert cell["acked_txid"] == cell["committed_txid"] >= 6
    ack_sum = value(after, "cellactors_ack_latency_seconds_sum")
    assert 0 < ack_sum < 30 * cell["acked_txid"]

    assert value(after, "cellactors_resident_cells") == 1
    assert value(after, "cellactors_unacked_transactions") == 0
    assert (
        value(after, "cellactors_activations_total", **{"class": "Counter", "source": "new"}) == 1
    )
    assert value(after, "cellactors_fences_total") == 0
    assert renewals_before <= value(after, "cellactors_lease_renewals_total") <= renewals_after
    assert value(after, "cellactors_node_info", node="m1", generation=served.node.generation) == 1
    assert value(after, "cellactors_node_status", status="serving") == 1
    assert value(after, "cellactors_node_status", status="fenced") == 0


def test_bucket_outcomes_match_what_the_node_sent(sw_bucket: S3Bucket) -> None:
    node = make_node(sw_bucket, "m2")
    try:
        cell = node.cell("Counter", "b")
        for _ in range(3):
            cell.increment("x")
        samples = parse(node.metrics_text())
        sent = node.bucket.snapshot()
    finally:
        node.stop()
    for kind in ("batch", "own", "seal"):
        for op in ("get", "put", "put_cas", "head"):
            finished = sum(
                v
                for (name, labels), v in samples.items()
                if name == "cellactors_bucket_requests_total"
                and ("op", op) in labels
                and ("kind", kind) in labels
            )
            assert finished == sent[(op, kind)], (op, kind)
    # The cell was new: its owner record did not exist when first read.
    assert value(
        samples, "cellactors_bucket_requests_total", op="get", kind="own", outcome="absent"
    )


def test_each_node_has_its_own_registry(sw_bucket: S3Bucket) -> None:
    one, two = make_node(sw_bucket, "r1"), make_node(sw_bucket, "r2")
    try:
        one.cell("Counter", "c").increment("x")
        first, second = parse(one.metrics_text()), parse(two.metrics_text())
    finally:
        one.stop()
        two.stop()
    ok = {"class": "Counter", "method": "increment", "outcome": "ok"}
    assert value(first, "cellactors_calls_total", **ok) == 1
    assert value(second, "cellactors_calls_total", **ok) == 0
    assert value(second, "cellactors_node_info", node="r2", generation=two.generation) == 1
    assert value(first, "cellactors_node_info", node="r2", generation=two.generation) == 0
    # Nothing went to the library's global registry.
    global_names = {m.name for m in prometheus_client.REGISTRY.collect()}
    assert not any(name.startswith("cellactors") for name in global_names)


def test_fence_is_counted_and_reported(sw_bucket: S3Bucket) -> None:
    node = make_node(sw_bucket, "f1")
    try:
        node.cell("Counter", "d").increment("x")
        node.lease.proxy().pause().get()
        node.fence("test: fenced on purpose")
        samples = parse(node.metrics_text())
    finally:
        node.stop()
    assert value(samples, "cellactors_fences_total") == 1
    assert value(samples, "cellactors_node_status", status="fenced") == 1
    assert value(samples, "cellactors_node_status", status="serving") == 0
    assert value(samples, "cellactors_resident_cells") == 0


def test_metered_bucket_classifies_outcomes() -> None:
    bucket = MeteredBucket(MemoryBucket())
    assert bucket.get("c/Counter:x/own.json") is None
    token = bucket.put("c/Counter:x/own.json", b"{}")
    assert bucket.put_cas("c/Counter:x/own.json", b"{}", Absent()).__class__.__name__ == "Rejected"
    assert bucket.put_cas("c/Counter:x/own.json", b"{}", Match(token)).__class__.__name__ == (
        "Applied"
    )
    assert [info.key for info in bucket.list("c/")] == ["c/Counter:x/own.json"]
    assert bucket.outcomes() == {
        ("get", "own", "absent"): 1,
        ("put", "own", "ok"): 1,
        ("put_cas", "own", "rejected"): 1,
        ("put_cas", "own", "ok"): 1,
        ("list", "other", "ok"): 1,
    }
    assert sum(bucket.snapshot().values()) == sum(bucket.outcomes().values())
