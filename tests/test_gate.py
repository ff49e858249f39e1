"""The write gate a fence closes: nothing reaches the store once it is closed, not even a
retry the S3 client makes inside a call that started before the fence."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import pytest

from cellactors.errors import BucketError, Fenced, NodeUnavailable, NotDurable
from cellactors.persistence.store.bucket import Absent, Bucket
from cellactors.persistence.store.gate import GatedBucket, _local
from cellactors.persistence.store.gcs import GcsBucket
from cellactors.persistence.store.metered import MeteredBucket
from cellactors.persistence.store.s3 import S3Bucket
from tests.helpers.buckets import CuttableBucket
from tests.helpers.cells import Counter
from tests.helpers.runtime import eventually, make_node


def test_a_closed_gate_refuses_every_request_before_sending(sw_bucket: S3Bucket) -> None:
    metered = MeteredBucket(sw_bucket)
    gate = GatedBucket(metered)
    gate.put("cells/C:a/x", b"1")
    assert gate.get("cells/C:a/x") is not None
    sent = sum(metered.snapshot().values())
    gate.close_gate("test")
    calls: list[Callable[[], object]] = [
        lambda: gate.get("cells/C:a/x"),
        lambda: gate.head("cells/C:a/x"),
        lambda: gate.put("cells/C:a/y", b"2"),
        lambda: gate.put_cas("cells/C:a/z", b"3", Absent()),
        lambda: gate.list("cells/"),
        lambda: gate.delete("cells/C:a/x"),
    ]
    for call in calls:
        with pytest.raises(Fenced, match="fenced itself"):
            call()
    assert gate.refused == len(calls)
    assert sum(metered.snapshot().values()) == sent  # nothing was sent
    assert sw_bucket.get("cells/C:a/y") is None and sw_bucket.get("cells/C:a/x") is not None


def test_the_s3_client_checks_the_gate_before_each_http_request(sw_bucket: S3Bucket) -> None:
    """A request already inside botocore (a retry loop, say) when the gate closes is refused
    at its next send: the dialect's before-send hook consults the calling thread's gate."""
    gate = GatedBucket(sw_bucket)
    gate.close_gate("test")
    _local.gate = gate  # as if this thread were inside gate.put when the fence came
    try:
        with pytest.raises(Fenced):
            sw_bucket.put("cells/C:a/late", b"x")
        with pytest.raises(Fenced):
            sw_bucket.put_cas("cells/C:a/late", b"x", Absent())
    finally:
        _local.gate = None
    assert sw_bucket.get("cells/C:a/late") is None


def test_the_gcs_client_checks_the_gate_before_each_http_request(gcs_bucket: GcsBucket) -> None:
    """The same for GCS: google-cloud-storage retries inside one call too, and each of its
    HTTP requests consults the calling thread's gate first."""
    gcs_bucket.put("cells/C:a/early", b"x")
    gate = GatedBucket(gcs_bucket)
    gate.close_gate("test")
    _local.gate = gate
    try:
        with pytest.raises(Fenced):
            gcs_bucket.put("cells/C:a/late", b"x")
        with pytest.raises(Fenced):
            gcs_bucket.put_cas("cells/C:a/late", b"x", Absent())
        with pytest.raises(Fenced):
            gcs_bucket.get("cells/C:a/early")
    finally:
        _local.gate = None
    assert gcs_bucket.get("cells/C:a/late") is None
    assert gate.refused == 3


class FailingBatches(CuttableBucket):
    """Batch PUTs fail like a 503 storm while ``failing``; counts the attempts."""

    def __init__(self, inner: Bucket) -> None:
        super().__init__(inner)
        self.failing = False
        self.attempts = 0

    def put(self, key, body):  # type: ignore[no-untyped-def]
        if self.failing and key.endswith(".batch"):
            self.attempts += 1
            raise BucketError("PUT failed: HTTP 503 SlowDown (test)")
        return self.inner.put(key, body)


def test_a_fenced_node_sends_nothing_more_and_its_held_call_is_unknown(
    sw_bucket: S3Bucket, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="cellactors.actors.node")
    store = FailingBatches(sw_bucket)
    node = make_node(store, "n1")
    try:
        cell = node.cell(Counter, "a")
        assert cell.increment("x") == 1
        store.failing = True
        outcome: list[NotDurable] = []

        def call() -> None:
            try:
                cell.increment("x")
            except NotDurable as err:
                outcome.append(err)

        caller = threading.Thread(target=call)
        caller.start()
        eventually(lambda: store.attempts >= 2, timeout=10)  # the replicator is retrying
        refused = node.gate.refused
        node.fence("test: lease lost")
        caller.join(10)
        assert outcome and outcome[0].outcome == "unknown"
        sent = sum(node.bucket.snapshot().values())
        eventually(lambda: node.gate.refused > refused, timeout=10)  # it tried, and was refused
        assert sum(node.bucket.snapshot().values()) == sent
        # A refused request is not retried until the operation deadline (15 s): the
        # replicator gives up at once and the cell is reset.
        resets = eventually(
            lambda: [r.message for r in caplog.records if "reset" in r.message] or False,
            timeout=5,
        )
        assert isinstance(resets, list) and "fenced itself" in resets[0]
        with pytest.raises(NodeUnavailable):
            cell.get("x")
    finally:
        node.stop()
