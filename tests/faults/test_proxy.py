"""The fault proxy itself, against SeaweedFS through ``S3Bucket(..., endpoint=proxy)``:
requests pass through unchanged (SigV4 still verifies), are classified and logged, and each
action does what it says."""

from __future__ import annotations

import email.utils
import json
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import boto3
import pytest

from cellactors.errors import AmbiguousWrite
from cellactors.persistence.store.bucket import Absent, Applied, CasResult, Match, Rejected
from cellactors.persistence.store.embedded import SeaweedServer
from cellactors.persistence.store.s3 import S3Bucket
from tests.faults.proxy import FaultProxy, classify
from tests.helpers.fleet import wait_for
from tests.helpers.stores import make_s3_bucket

pytestmark = pytest.mark.faults

T = TypeVar("T")
OWN = "cells/Ledger:a/own.json"
BATCH = "cells/Ledger:a/e1/0000000000000001-0000000000000001.batch"


@pytest.fixture
def proxy(seaweed: SeaweedServer) -> Iterator[FaultProxy]:
    with FaultProxy(seaweed.endpoint, name="unit") as p:
        yield p


@pytest.fixture
def direct(seaweed: SeaweedServer) -> S3Bucket:
    """A fresh bucket, reached without the proxy."""
    return make_s3_bucket(seaweed.endpoint)


def via(proxy: FaultProxy, bucket: S3Bucket) -> S3Bucket:
    return S3Bucket(bucket.bucket, endpoint=proxy.endpoint)


class Background:
    """Run ``fn`` in a thread; :meth:`result` waits for it with a deadline."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.value: Any = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self.value = fn()
        except BaseException as err:
            self.error = err

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self, timeout: float = 20.0) -> Any:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"still running after {timeout:g}s"
        if self.error is not None:
            raise self.error
        return self.value


def test_classify_every_kind() -> None:
    cases = {
        ("PUT", "/b/" + BATCH, ""): ("batch", BATCH),
        ("GET", "/b/cells/Ledger:a/own.json", ""): ("own", OWN),
        ("PUT", "/b/cells/Ledger%3Aa/own.json", ""): ("own", OWN),
        ("PUT", "/b/cells/Ledger:a/e1.seal.json", ""): ("seal", "cells/Ledger:a/e1.seal.json"),
        ("PUT", "/b/cells/Ledger:a/snap/01.e1.snap", ""): (
            "snapshot",
            "cells/Ledger:a/snap/01.e1.snap",
        ),
        ("PUT", "/b/nodes/n1.json", ""): ("lease", "nodes/n1.json"),
        ("GET", "/b/fleet/peer-auth.json", ""): ("peer-auth", "fleet/peer-auth.json"),
        ("PUT", "/b/probe/x", ""): ("probe", "probe/x"),
        ("GET", "/b/elsewhere", ""): ("other", "elsewhere"),
        ("GET", "/b", "list-type=2&prefix=nodes%2F"): ("list", "nodes/"),
        ("GET", "/b/", "list-type=2&prefix=cells/x/"): ("list", "cells/x/"),
        ("HEAD", "/b", ""): ("other", ""),
        ("DELETE", "/b/probe/x", ""): ("delete", "probe/x"),
    }
    for (method, path, query), expected in cases.items():
        assert classify(method, path, query) == expected, (method, path, query)
    assert classify("GET", "/b/fleet1/nodes/n.json", "", prefix="fleet1") == (
        "lease",
        "nodes/n.json",
    )


def test_requests_pass_through_and_are_logged(proxy: FaultProxy, direct: S3Bucket) -> None:
    bucket = via(proxy, direct)
    body = json.dumps({"node": "n1", "epoch": 1}).encode()
    assert isinstance(bucket.put_cas(OWN, body, Absent()), Applied)
    bucket.put(BATCH, b"x" * 100_000)
    stored = direct.get(BATCH)
    assert stored is not None and stored.body == b"x" * 100_000
    got = bucket.get(OWN)
    assert got is not None and got.body == body
    assert [o.key for o in bucket.list("cells/")] == [BATCH, OWN]
    assert bucket.head("cells/none") is None
    bucket.delete(BATCH)
    assert direct.get(BATCH) is None

    log = proxy.log()
    assert [(r.kind, r.method) for r in log] == [
        ("own", "PUT"),
        ("batch", "PUT"),
        ("own", "GET"),
        ("list", "GET"),
        ("other", "HEAD"),
        ("delete", "DELETE"),
    ]
    assert [r.status for r in log] == [200, 200, 200, 200, 404, 204]
    assert all(r.action == "forward" and r.answered and r.answered >= r.arrived for r in log)
    (own,) = proxy.own_writes()
    assert own.record() == {"node": "n1", "epoch": 1}
    assert own.if_none_match == "*" and own.etag
    assert proxy.requests(kind="batch", method="put")[0].key == BATCH


def test_delay_waits_before_forwarding(proxy: FaultProxy, direct: S3Bucket) -> None:
    rule = proxy.delay(0.3, kind="own", method="GET")
    bucket = via(proxy, direct)
    bucket.put(OWN, b"{}")
    started = time.monotonic()
    assert bucket.get(OWN) is not None
    assert time.monotonic() - started >= 0.3
    assert rule.applied == 1
    (slow,) = proxy.requests(action="delay")
    assert slow.answered is not None and slow.answered - slow.arrived >= 0.3


def test_fail_answers_an_s3_error_without_forwarding(proxy: FaultProxy, direct: S3Bucket) -> None:
    bucket = via(proxy, direct)
    proxy.fail(503, kind="own", method="PUT", times=1)
    with pytest.raises(AmbiguousWrite, match="503 SlowDown"):
        bucket.put_cas(OWN, b"{}", Absent())
    assert direct.get(OWN) is None
    proxy.fail(500, kind="batch", times=1)
    bucket.put(BATCH, b"b")  # the plain client retries a 500; the second try passes
    statuses = [(r.status, r.store_status) for r in proxy.requests(kind="batch")]
    assert statuses == [(500, None), (200, 200)]


def test_spurious_412_rejects_without_writing(proxy: FaultProxy, direct: S3Bucket) -> None:
    bucket = via(proxy, direct)
    proxy.spurious_412(kind="own", times=1)
    result = bucket.put_cas(OWN, b"{}", Absent())
    assert isinstance(result, Rejected)
    assert direct.get(OWN) is None
    assert isinstance(bucket.put_cas(OWN, b"{}", Absent()), Applied)


def test_hang_holds_then_closes_without_forwarding(proxy: FaultProxy, direct: S3Bucket) -> None:
    bucket = via(proxy, direct)
    rule = proxy.hang(kind="own", method="PUT")
    call = Background(lambda: bucket.put_cas(OWN, b"{}", Absent()))
    rule.wait_held(1, 10)
    assert not call.done
    rule.release()
    with pytest.raises(AmbiguousWrite):
        call.result()
    assert direct.get(OWN) is None
    (hung,) = proxy.requests(action="hang")
    assert hung.status is None and hung.store_status is None


def test_apply_then_drop_is_an_ambiguous_write_that_landed(
    proxy: FaultProxy, direct: S3Bucket
) -> None:
    bucket = via(proxy, direct)
    proxy.apply_then_drop(kind="own", method="PUT", times=1)
    with pytest.raises(AmbiguousWrite):
        bucket.put_cas(OWN, b'{"node":"n1","epoch":1}', Absent())
    stored = direct.get(OWN)
    assert stored is not None and stored.body == b'{"node":"n1","epoch":1}'
    (dropped,) = proxy.requests(action="apply_then_drop")
    assert dropped.status is None and dropped.store_status == 200 and dropped.applied
    assert [r.record() for r in proxy.own_writes()] == [{"node": "n1", "epoch": 1}]


def test_hold_lands_the_write_only_after_release(proxy: FaultProxy, direct: S3Bucket) -> None:
    bucket = via(proxy, direct)
    direct.put(OWN, b"old")
    current = direct.head(OWN)
    assert current is not None
    rule = proxy.hold(kind="own", method="PUT", times=1)
    call: Background = Background(lambda: bucket.put_cas(OWN, b"new", Match(current.token)))
    rule.wait_arrived(10)
    rule.wait_held(1, 10)
    stored = direct.get(OWN)
    assert stored is not None and stored.body == b"old"
    assert not call.done
    released = time.time()
    rule.release()
    result: CasResult = call.result()
    assert isinstance(result, Applied)
    stored = direct.get(OWN)
    assert stored is not None and stored.body == b"new"
    (held,) = proxy.requests(action="hold")
    assert held.store_answered is not None and held.store_answered >= released
    assert held.status == 200


def test_stop_drops_held_requests_unforwarded(seaweed: SeaweedServer, direct: S3Bucket) -> None:
    proxy = FaultProxy(seaweed.endpoint, name="stopping").start()
    bucket = via(proxy, direct)
    rule = proxy.hold(kind="own")
    call = Background(lambda: bucket.put_cas(OWN, b"{}", Absent()))
    rule.wait_held(1, 10)
    proxy.stop()
    with pytest.raises(AmbiguousWrite):
        call.result()
    assert direct.get(OWN) is None


def test_clock_offset_shifts_the_date_header(proxy: FaultProxy, direct: S3Bucket) -> None:
    direct.put(OWN, b"{}")
    client = boto3.client("s3", endpoint_url=proxy.endpoint, region_name="us-east-1")

    def store_date() -> float:
        head = client.head_object(Bucket=direct.bucket, Key=OWN)
        date = head["ResponseMetadata"]["HTTPHeaders"]["date"]
        return email.utils.parsedate_to_datetime(date).timestamp()

    assert abs(store_date() - time.time()) < 1.5
    rule = proxy.clock_offset(5, kind="own")
    assert 3.5 < store_date() - time.time() < 6.5
    proxy.remove(rule)
    proxy.clock_offset(-30, kind="own")
    assert -31.5 < store_date() - time.time() < -28.5
    assert {r.action for r in proxy.requests(kind="own")} == {"forward", "clock_offset"}


def test_lag_listings_hides_recent_objects_from_listings_only(
    proxy: FaultProxy, direct: S3Bucket
) -> None:
    """Listings leave out what was modified in the last 1.5 s (LastModified has whole
    seconds, so the older object is written two seconds before the newer one)."""
    newer = "cells/Ledger:a/e1/0000000000000002-0000000000000002.batch"
    direct.put(BATCH, b"old")
    written = time.time()
    wait_for("two seconds to pass", lambda: time.time() >= written + 2.0, 5)
    direct.put(newer, b"new")
    lagging = via(proxy, direct)
    rule = proxy.lag_listings(1.5)
    assert [o.key for o in lagging.list("cells/")] == [BATCH]
    got = lagging.get(newer)  # reads see it at once
    assert got is not None and got.body == b"new"
    proxy.remove(rule)
    assert [o.key for o in lagging.list("cells/")] == [BATCH, newer]


def test_matching_by_key_method_count_and_seeded_probability(
    proxy: FaultProxy, direct: S3Bucket
) -> None:
    bucket = via(proxy, direct)
    only_b = proxy.spurious_412(key=r"/b-\d+$", method="PUT")
    for i in range(3):
        assert isinstance(bucket.put_cas(f"cells/x/a-{i}", b"{}", Absent()), Applied)
        assert isinstance(bucket.put_cas(f"cells/x/b-{i}", b"{}", Absent()), Rejected)
    assert only_b.applied == 3
    proxy.remove(only_b)

    twice = proxy.spurious_412(kind="other", times=2)
    outcomes = [bucket.put_cas(f"cells/y/{i}", b"{}", Absent()) for i in range(4)]
    assert [type(o) for o in outcomes] == [Rejected, Rejected, Applied, Applied]
    assert twice.applied == 2
    proxy.remove(twice)

    proxy.spurious_412(kind="other", probability=0.5, seed=7)
    draws = random.Random(7)
    expected = [draws.random() < 0.5 for _ in range(20)]
    got = [isinstance(bucket.put_cas(f"cells/z/{i}", b"{}", Absent()), Rejected) for i in range(20)]
    assert got == expected and any(got) and not all(got)


def test_active_for_ends_an_outage_window(proxy: FaultProxy, direct: S3Bucket) -> None:
    bucket = via(proxy, direct)
    rule = proxy.spurious_412(kind="other", active_for=0.3)
    assert isinstance(bucket.put_cas("cells/w/0", b"{}", Absent()), Rejected)
    started = rule.first_match
    assert started is not None
    wait_for("the outage window to pass", lambda: time.time() > started + 0.3, 5)
    assert isinstance(bucket.put_cas("cells/w/1", b"{}", Absent()), Applied)
    assert rule.applied == 1
