"""The direct path for plain S3 GETs and PUTs (:mod:`cellactors.persistence.s3_direct`):
its signatures verify on real stores (SeaweedFS and moto's server), boto3 sends nothing when
it succeeds, a request it cannot decide is sent again through boto3, a ``404`` that is not
``NoSuchKey`` never reads as a missing object, and a closed fence gate stops it before the
wire."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from cellactors.errors import BucketError
from cellactors.persistence.embedded import SeaweedServer
from cellactors.persistence.gate import Fenced, GatedBucket
from cellactors.persistence.s3 import S3Bucket
from cellactors.persistence.s3_direct import DirectS3, Undecided
from tests.conftest import make_s3_bucket
from tests.faults.proxy import FaultProxy

# Key shapes the runtime writes, and characters a path must encode for the signature.
KEYS = [
    "cells/Counter:a/e1/0000000000000001-0000000000000002.batch",
    "cells/Ledger$x.y-z_1:acct-7/own.json",
    "odd/a b+c%d~e=f&g,h;i@j(k)'l!m*n",
    "odd/\u00e9t\u00e9/\u65e5\u672c",
]


class BotoSends:
    """Counts the HTTP requests boto3 sends through one client (its before-send event)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.count = 0

    def __call__(self, **_kwargs: Any) -> None:
        self.count += 1

    def __enter__(self) -> BotoSends:
        self.client.meta.events.register("before-send.s3", self)
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.meta.events.unregister("before-send.s3", self)


@pytest.fixture
def proxy(seaweed: SeaweedServer) -> Iterator[FaultProxy]:
    with FaultProxy(seaweed.endpoint, "direct") as p:
        yield p


@pytest.mark.parametrize("store", ["seaweed", "moto"])
def test_direct_requests_verify_on_real_stores_and_bypass_boto3(
    store: str, request: pytest.FixtureRequest
) -> None:
    endpoint = (
        request.getfixturevalue("seaweed").endpoint
        if store == "seaweed"
        else request.getfixturevalue("moto_server")
    )
    bucket = make_s3_bucket(endpoint, prefix="fleet")
    assert bucket._direct is not None
    with BotoSends(bucket._plain) as sends:
        for n, key in enumerate(KEYS):
            etag = bucket.put(key, f"body {n}".encode())
            got = bucket.get(key)
            assert got is not None and got.body == f"body {n}".encode(), key
            assert got.token.strip('"') == etag.strip('"')
        assert bucket.get("cells/Counter:a/missing.json") is None
        assert sends.count == 0
    # boto3 reads what the direct path wrote, under the same (prefixed) keys.
    for n, key in enumerate(KEYS):
        obj = bucket._get(bucket._plain, key)
        assert obj is not None and obj.body == f"body {n}".encode()
    assert sorted(info.key for info in bucket.list("")) == sorted(KEYS)


def test_a_failed_direct_request_is_sent_again_through_boto3(proxy: FaultProxy) -> None:
    bucket = make_s3_bucket(proxy.endpoint)
    bucket.put("k/obj", b"v1")
    rule = proxy.fail(500, "InternalError", method="GET", key="^k/obj$", times=1)
    got = bucket.get("k/obj")
    assert got is not None and got.body == b"v1"
    gets = proxy.requests(method="GET", key="^k/obj$")
    assert [r.status for r in gets] == [500, 200]
    assert rule.applied == 1

    # A PUT the store applied but never answered: boto3 sends the same body again.
    proxy.apply_then_drop(method="PUT", key="^k/dropped$", times=1)
    bucket.put("k/dropped", b"v2")
    puts = proxy.requests(method="PUT", key="^k/dropped$")
    assert [r.status for r in puts] == [None, 200]
    assert all(r.applied for r in puts)
    again = bucket.get("k/dropped")
    assert again is not None and again.body == b"v2"


def test_a_404_that_is_not_no_such_key_is_not_a_missing_object(proxy: FaultProxy) -> None:
    bucket = make_s3_bucket(proxy.endpoint)
    bucket.put("own.json", b"{}")
    # The direct path answers only for NoSuchKey; anything else goes to boto3, which
    # sees the store recover here.
    proxy.fail(404, "NoSuchBucket", method="GET", key="^own.json$", times=1)
    got = bucket.get("own.json")
    assert got is not None and got.body == b"{}"
    assert [r.status for r in proxy.requests(method="GET", key="^own.json$")] == [404, 200]


def test_a_failure_that_persists_raises_as_boto3_classifies_it(proxy: FaultProxy) -> None:
    bucket = S3Bucket(make_s3_bucket(proxy.endpoint).bucket, endpoint=proxy.endpoint, timeout=3)
    proxy.fail(503, "SlowDown", method="PUT", key="^k/down$")
    with BotoSends(bucket._plain) as sends, pytest.raises(BucketError, match="PUT k/down failed"):
        bucket.put("k/down", b"x")
    # One direct attempt, then boto3's own attempts and retries.
    assert sends.count > 1
    assert len(proxy.requests(method="PUT", key="^k/down$")) == 1 + sends.count


def test_a_closed_gate_stops_the_direct_path_before_the_wire(proxy: FaultProxy) -> None:
    bucket = make_s3_bucket(proxy.endpoint)
    gate = GatedBucket(bucket)
    before = len(proxy.log())
    with gate._through("PUT", "k/late"):  # the gate closes while a request is under way
        gate.close_gate("lease lost")
        with pytest.raises(Fenced):
            bucket.put("k/late", b"x")
        with pytest.raises(Fenced):
            bucket.get("k/late")
    assert len(proxy.log()) == before
    assert gate.refused == 2


def test_the_direct_path_is_off_where_boto3_would_use_a_proxy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for var in ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY"):
        monkeypatch.delenv(var, raising=False)
    assert DirectS3.usable("http://127.0.0.1:8333")
    assert not DirectS3.usable(None)  # AWS's own endpoints: boto3 resolves them
    monkeypatch.setenv("http_proxy", "http://proxy.invalid:3128")
    assert not DirectS3.usable("http://127.0.0.1:8333")
    assert DirectS3.usable("https://store.invalid")  # no proxy for https
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    assert DirectS3.usable("http://127.0.0.1:8333")


def test_a_direct_request_that_hangs_is_abandoned_at_the_timeout(proxy: FaultProxy) -> None:
    # The store never answers the direct attempt: after the read timeout boto3 sends the
    # request again (a GET, and a PUT of the same bytes, may be sent twice).
    name = make_s3_bucket(proxy.endpoint).bucket
    bucket = S3Bucket(name, endpoint=proxy.endpoint, timeout=1.0)
    bucket.put("k/slow", b"v1")
    for method, call in (
        ("GET", lambda: bucket.get("k/slow")),
        ("PUT", lambda: bucket.put("k/slow", b"v1")),
    ):
        rule = proxy.hang(method=method, key="^k/slow$", times=1)
        with BotoSends(bucket._plain) as sends:
            assert call()
        assert rule.applied == 1 and sends.count == 1
        tried = proxy.requests(method=method, key="^k/slow$")[-2:]
        assert [(r.action, r.status) for r in tried] == [("hang", None), ("forward", 200)]
        rule.release()
    got = bucket.get("k/slow")
    assert got is not None and got.body == b"v1"


def test_a_body_cut_short_is_never_taken_for_the_object(
    seaweed: SeaweedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # urllib3 1.x returns a body shorter than its Content-Length without an error; a short
    # batch would then read as a torn one. The direct path leaves such an answer to boto3.
    bucket = make_s3_bucket(seaweed.endpoint)
    bucket.put("k/whole", b"x" * 100)
    direct = bucket._direct
    assert direct is not None

    class Short:
        status = 200
        headers = {"ETag": '"e"', "Content-Length": "100"}
        data = b"x" * 10

    monkeypatch.setattr(direct.pool, "request", lambda *a, **kw: Short())
    with pytest.raises(Undecided, match="10 of 100 bytes"):
        direct.get(bucket.bucket, "k/whole")
    got = bucket.get("k/whole")  # boto3 reads it whole
    assert got is not None and got.body == b"x" * 100
