"""The bucket contract (docs/protocol.md, "Conditional writes"), run against every dialect and
server the suite can start: SeaweedFS and moto server (S3), fake-gcs-server (GCS)."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import boto3
import pytest

from cellactors.errors import AmbiguousWrite, BucketError, StoreUnreachable
from cellactors.persistence.store.bucket import (
    MAX_CAS_BODY,
    Absent,
    Applied,
    Bucket,
    Match,
    Rejected,
)
from cellactors.persistence.store.embedded import SeaweedServer
from cellactors.persistence.store.gcs import EMULATOR_VAR, GcsBucket
from cellactors.persistence.store.s3 import S3Bucket
from tests.helpers.gcs import new_gcs_bucket_name
from tests.helpers.stores import new_bucket_name


@dataclass
class Store:
    """One server: ``create()`` makes a new physical bucket and returns its name;
    ``open(name, prefix)`` returns a Bucket object on it."""

    kind: str
    create: Callable[[], str]
    open: Callable[[str, str], Bucket]

    def fresh(self, prefix: str = "") -> Bucket:
        return self.open(self.create(), prefix)


def _s3_store(kind: str, endpoint: str) -> Store:
    def create() -> str:
        name = new_bucket_name(kind)
        client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        client.create_bucket(Bucket=name)
        return name

    return Store(kind, create, lambda name, prefix: S3Bucket(name, prefix, endpoint=endpoint))


def _gcs_store() -> Store:
    def create() -> str:
        name = new_gcs_bucket_name()
        GcsBucket(name).ensure_exists()
        return name

    return Store("gcs", create, lambda name, prefix: GcsBucket(name, prefix))


@pytest.fixture(params=["seaweed", "moto", "gcs"])
def store(request: pytest.FixtureRequest) -> Store:
    if request.param == "seaweed":
        server: SeaweedServer = request.getfixturevalue("seaweed")
        return _s3_store("sw", server.endpoint)
    if request.param == "moto":
        return _s3_store("moto", request.getfixturevalue("moto_server"))
    request.getfixturevalue("fake_gcs")
    return _gcs_store()


@pytest.fixture
def bucket(store: Store) -> Bucket:
    return store.fresh()


def _applied(result: object) -> Applied:
    assert isinstance(result, Applied), result
    return result


def test_missing_key_reads_as_none(bucket: Bucket) -> None:
    assert bucket.get("nothing/here.json") is None
    assert bucket.head("nothing/here.json") is None
    assert list(bucket.list("nothing/")) == []


def test_put_get_head_agree(bucket: Bucket) -> None:
    token = bucket.put("a/b.bin", b"\x00payload\xff")
    got = bucket.get("a/b.bin")
    assert got is not None
    assert got.body == b"\x00payload\xff"
    assert got.token == token
    info = bucket.head("a/b.bin")
    assert info is not None
    assert (info.key, info.token, info.size) == ("a/b.bin", token, 9)


def test_put_overwrites_and_changes_token(bucket: Bucket) -> None:
    first = bucket.put("k", b"one")
    second = bucket.put("k", b"two")
    assert first != second
    got = bucket.get("k")
    assert got is not None and (got.body, got.token) == (b"two", second)


def test_create_applies_once_then_rejects(bucket: Bucket) -> None:
    applied = _applied(bucket.put_cas("own.json", b'{"v":1}', Absent()))
    got = bucket.get("own.json")
    assert got is not None and (got.body, got.token) == (b'{"v":1}', applied.token)

    again = bucket.put_cas("own.json", b'{"v":2}', Absent())
    assert isinstance(again, Rejected)
    got = bucket.get("own.json")
    assert got is not None and (got.body, got.token) == (b'{"v":1}', applied.token)


def test_match_current_applies_and_stale_rejects(bucket: Bucket) -> None:
    first = _applied(bucket.put_cas("own.json", b'{"epoch":1}', Absent()))
    second = _applied(bucket.put_cas("own.json", b'{"epoch":2}', Match(first.token)))
    assert second.token != first.token
    got = bucket.get("own.json")
    assert got is not None and (got.body, got.token) == (b'{"epoch":2}', second.token)

    stale = bucket.put_cas("own.json", b'{"epoch":3}', Match(first.token))
    assert isinstance(stale, Rejected)
    got = bucket.get("own.json")
    assert got is not None and (got.body, got.token) == (b'{"epoch":2}', second.token)


def test_match_token_from_get_and_head(bucket: Bucket) -> None:
    bucket.put("rec", b"v1")
    got = bucket.get("rec")
    assert got is not None
    after_get = _applied(bucket.put_cas("rec", b"v2", Match(got.token)))
    info = bucket.head("rec")
    assert info is not None and info.token == after_get.token
    _applied(bucket.put_cas("rec", b"v3", Match(info.token)))
    final = bucket.get("rec")
    assert final is not None and final.body == b"v3"


def test_match_on_missing_key_rejects_and_writes_nothing(bucket: Bucket) -> None:
    other = bucket.put("elsewhere", b"x")  # a real token, of another object
    result = bucket.put_cas("absent.json", b"{}", Match(other))
    assert isinstance(result, Rejected)
    assert bucket.get("absent.json") is None


def test_match_after_delete_rejects(bucket: Bucket) -> None:
    created = _applied(bucket.put_cas("gone.json", b"{}", Absent()))
    bucket.delete("gone.json")
    assert isinstance(bucket.put_cas("gone.json", b'{"x":1}', Match(created.token)), Rejected)
    assert bucket.get("gone.json") is None


def test_read_after_write(bucket: Bucket) -> None:
    token = _applied(bucket.put_cas("raw", b"0", Absent())).token
    for i in range(1, 8):
        body = str(i).encode()
        token = _applied(bucket.put_cas("raw", body, Match(token))).token
        got = bucket.get("raw")
        assert got is not None and (got.body, got.token) == (body, token)
        assert [o.key for o in bucket.list("raw")] == ["raw"]


def test_oversized_conditional_body_is_refused(bucket: Bucket) -> None:
    with pytest.raises(ValueError):
        bucket.put_cas("big", b"x" * (MAX_CAS_BODY + 1), Absent())
    assert bucket.get("big") is None


def test_list_returns_relative_keys_in_order_with_metadata(bucket: Bucket) -> None:
    before_ms = int(time.time() * 1000)
    tokens = {
        "nodes/b.json": bucket.put("nodes/b.json", b"bb"),
        "nodes/a.json": bucket.put("nodes/a.json", b"a"),
        "nodes/sub/c.json": bucket.put("nodes/sub/c.json", b"ccc"),
    }
    bucket.put("nodesx/not-me.json", b"no")
    bucket.put("cells/C:x/own.json", b"no")

    listed = list(bucket.list("nodes/"))
    assert [o.key for o in listed] == ["nodes/a.json", "nodes/b.json", "nodes/sub/c.json"]
    for info in listed:
        assert info.token == tokens[info.key]
        head = bucket.head(info.key)
        assert head is not None and head.token == info.token
        # Servers run on this machine: their clock is ours, up to store rounding.
        assert before_ms - 2_000 <= info.last_modified_ms <= int(time.time() * 1000) + 2_000
    assert [o.size for o in listed] == [1, 2, 3]
    assert {o.key for o in bucket.list("")} == {
        *tokens,
        "nodesx/not-me.json",
        "cells/C:x/own.json",
    }


def test_delete_is_idempotent(bucket: Bucket) -> None:
    bucket.put("d/one", b"1")
    bucket.put("d/two", b"2")
    bucket.delete("d/one")
    assert bucket.get("d/one") is None
    assert bucket.head("d/one") is None
    bucket.delete("d/one")
    bucket.delete("d/never-existed")
    assert [o.key for o in bucket.list("d/")] == ["d/two"]


def test_prefixes_isolate_fleets_on_one_physical_bucket(store: Store) -> None:
    name = store.create()
    # "fleet" is a string prefix of "fleet2": isolation must come from the separator.
    one = store.open(name, "fleet")
    two = store.open(name, "fleet2")
    nested = store.open(name, "team/fleet")
    raw = store.open(name, "")

    _applied(one.put_cas("cells/C:a/own.json", b"one", Absent()))
    _applied(two.put_cas("cells/C:a/own.json", b"two", Absent()))
    _applied(nested.put_cas("cells/C:a/own.json", b"nested", Absent()))
    one.put("nodes/n1.json", b"n1")

    for bucket, body in ((one, b"one"), (two, b"two"), (nested, b"nested")):
        got = bucket.get("cells/C:a/own.json")
        assert got is not None and got.body == body
    assert [o.key for o in one.list("")] == ["cells/C:a/own.json", "nodes/n1.json"]
    assert [o.key for o in two.list("")] == ["cells/C:a/own.json"]
    assert [o.key for o in nested.list("cells/")] == ["cells/C:a/own.json"]
    assert two.get("nodes/n1.json") is None
    assert two.head("nodes/n1.json") is None

    # The raw store shows every key under its fleet's prefix.
    assert sorted(o.key for o in raw.list("")) == [
        "fleet/cells/C:a/own.json",
        "fleet/nodes/n1.json",
        "fleet2/cells/C:a/own.json",
        "team/fleet/cells/C:a/own.json",
    ]
    raw_got = raw.get("fleet2/cells/C:a/own.json")
    assert raw_got is not None and raw_got.body == b"two"

    two.delete("nodes/n1.json")  # someone else's relative key: must not touch fleet one
    assert one.get("nodes/n1.json") is not None


@pytest.fixture(params=["seaweed", "gcs"])
def atomic_store(request: pytest.FixtureRequest) -> Store:
    """Stores that enforce conditional writes atomically (moto server does not, docs/stores.md)."""
    if request.param == "seaweed":
        server: SeaweedServer = request.getfixturevalue("seaweed")
        return _s3_store("sw", server.endpoint)
    request.getfixturevalue("fake_gcs")
    return _gcs_store()


def _race_create(bucket: Bucket, key: str, writers: int) -> list[object]:
    """``writers`` threads create ``key`` at once; return each one's outcome."""
    barrier = threading.Barrier(writers)
    results: list[object] = []
    lock = threading.Lock()

    def write(i: int) -> None:
        barrier.wait()
        try:
            outcome: object = bucket.put_cas(key, f'{{"w":{i}}}'.encode(), Absent())
        except AmbiguousWrite as err:
            outcome = err
        with lock:
            results.append(outcome)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return results


def test_racing_creates_have_one_winner(atomic_store: Store) -> None:
    bucket = atomic_store.fresh()
    writers = 4
    for round_no in range(3):
        key = f"race/{round_no}.json"
        results = _race_create(bucket, key, writers)
        assert len(results) == writers
        winners = [r for r in results if isinstance(r, Applied)]
        assert len(winners) == 1, results
        assert all(isinstance(r, (Applied, Rejected)) for r in results), results
        stored = bucket.get(key)
        assert stored is not None and stored.token == winners[0].token


# --- failure classification, against a stub server that answers every request the same ---


class _Stub:
    def __init__(self) -> None:
        self.status = 503
        self.requests: list[str] = []
        stub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            # HTTP/1.1 so that boto3's "Expect: 100-continue" is answered at once.
            protocol_version = "HTTP/1.1"

            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                stub.requests.append(f"{self.command} {self.path}")
                if self.path.startswith("/upload/") or self.path.startswith("/storage/"):
                    body = b'{"error": {"code": %d, "message": "stub"}}' % stub.status
                    ctype = "application/json"
                else:
                    body = b"<Error><Code>Stub</Code><Message>stub</Message></Error>"
                    ctype = "application/xml"
                self.send_response(stub.status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Connection", "close")
                self.close_connection = True
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _answer

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stub() -> Iterator[_Stub]:
    server = _Stub()
    yield server
    server.close()


def _stub_bucket(kind: str, endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Bucket:
    if kind == "s3":
        return S3Bucket("stub-bucket", "pfx", endpoint=endpoint, timeout=5.0)
    monkeypatch.setenv(EMULATOR_VAR, endpoint)
    return GcsBucket("stub-bucket", "pfx", timeout=5.0)


@pytest.mark.parametrize("kind", ["s3", "gcs"])
@pytest.mark.parametrize("status", [500, 503])
def test_5xx_on_conditional_write_is_ambiguous_and_not_retried(
    kind: str, status: int, stub: _Stub, monkeypatch: pytest.MonkeyPatch
) -> None:
    stub.status = status
    bucket = _stub_bucket(kind, stub.endpoint, monkeypatch)
    with pytest.raises(AmbiguousWrite) as info:
        bucket.put_cas("own.json", b"{}", Absent())
    assert len(stub.requests) == 1, (stub.requests, info.value)
    if kind == "s3":
        assert stub.requests[0] == "PUT /stub-bucket/pfx/own.json"
    else:  # one multipart request carrying the precondition, never a resumable session
        assert stub.requests[0].startswith("POST /upload/storage/v1/b/stub-bucket/o?")
        assert "uploadType=multipart" in stub.requests[0]
        assert "ifGenerationMatch=0" in stub.requests[0]


@pytest.mark.parametrize("kind", ["s3", "gcs"])
def test_412_on_create_is_rejected(kind: str, stub: _Stub, monkeypatch: pytest.MonkeyPatch) -> None:
    stub.status = 412
    bucket = _stub_bucket(kind, stub.endpoint, monkeypatch)
    assert isinstance(bucket.put_cas("own.json", b"{}", Absent()), Rejected)
    assert len(stub.requests) == 1


@pytest.mark.parametrize("kind", ["s3", "gcs"])
def test_other_4xx_on_conditional_write_is_a_definite_failure(
    kind: str, stub: _Stub, monkeypatch: pytest.MonkeyPatch
) -> None:
    stub.status = 403
    bucket = _stub_bucket(kind, stub.endpoint, monkeypatch)
    with pytest.raises(BucketError) as info:
        bucket.put_cas("own.json", b"{}", Absent())
    assert not isinstance(info.value, AmbiguousWrite)


@pytest.mark.parametrize("kind", ["s3", "gcs"])
def test_unreachable_store_fails_a_conditional_write_definitely(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No connection was made, so the request never reached the store: a definite failure,
    not an ambiguous write (a connection lost after sending stays ambiguous)."""
    stub = _Stub()
    endpoint = stub.endpoint
    stub.close()  # nothing listens there any more
    bucket = _stub_bucket(kind, endpoint, monkeypatch)
    with pytest.raises(StoreUnreachable) as info:
        bucket.put_cas("own.json", b"{}", Absent())
    assert not isinstance(info.value, AmbiguousWrite)


@pytest.mark.parametrize("kind", ["s3", "gcs"])
def test_404_on_match_is_rejected_but_on_create_is_a_failure(
    kind: str, stub: _Stub, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Some stores answer a precondition on a missing key with 404 instead of 412.
    stub.status = 404
    bucket = _stub_bucket(kind, stub.endpoint, monkeypatch)
    assert isinstance(bucket.put_cas("own.json", b"{}", Match("1234")), Rejected)
    assert len(stub.requests) == 1
    # A 404 to a create means the bucket itself is missing: a definite error.
    with pytest.raises(BucketError) as info:
        bucket.put_cas("own.json", b"{}", Absent())
    assert not isinstance(info.value, AmbiguousWrite)
