"""The direct path for plain S3 GETs and PUTs (:mod:`cellactors.persistence.store.s3_direct`):
its signatures verify on real stores (SeaweedFS and moto's server), boto3 sends nothing when
it succeeds, a request it cannot decide is sent again through boto3, a ``404`` that is not
``NoSuchKey`` never reads as a missing object, and a closed fence gate stops it before the
wire."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from pathlib import Path
from typing import Any

import botocore.credentials
import botocore.exceptions
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from cellactors.errors import BucketError, Fenced
from cellactors.persistence.store.gate import GatedBucket
from cellactors.persistence.store.s3 import S3Bucket
from cellactors.persistence.store.s3_direct import DirectS3, ListPage, Undecided
from tests.faults.proxy import FaultProxy
from tests.helpers.boto_sends import OK_HEAD, BotoSends
from tests.helpers.raw_server import RawServer
from tests.helpers.stores import make_s3_bucket

# Key shapes the runtime writes, and characters a path must encode for the signature.
KEYS = [
    "cells/Counter:a/e1/0000000000000001-0000000000000002.batch",
    "cells/Ledger$x.y-z_1:acct-7/own.json",
    "odd/a b+c%d~e=f&g,h;i@j(k)'l!m*n",
    "odd/\u00e9t\u00e9/\u65e5\u672c",
]


def test_direct_requests_verify_on_real_stores_and_bypass_boto3(s3_endpoint: str) -> None:
    bucket = make_s3_bucket(s3_endpoint, prefix="fleet")
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
    # request again (a GET, a listing page, and a PUT of the same bytes, may be sent twice).
    name = make_s3_bucket(proxy.endpoint).bucket
    bucket = S3Bucket(name, endpoint=proxy.endpoint, timeout=1.0)
    bucket.put("k/slow", b"v1")
    for kind, method, call in (
        (None, "GET", lambda: bucket.get("k/slow")),
        (None, "PUT", lambda: bucket.put("k/slow", b"v1")),
        ("list", "GET", lambda: [info.key for info in bucket.list("k/")] == ["k/slow"]),
    ):
        key = "^k/$" if kind == "list" else "^k/slow$"
        before = len(proxy.requests(method=method, key=key))
        rule = proxy.hang(method=method, key=key, kind=kind, times=1)
        with BotoSends(bucket._plain) as sends:
            assert call()
        # The direct attempt hung and was never answered; then boto3 sent it (a connection
        # boto3 finds closed may cost it a retry of its own) and was answered.
        tried = proxy.requests(method=method, key=key)[before:]
        assert rule.applied == 1 and sends.count >= len(tried) - 1 >= 1
        assert (tried[0].action, tried[0].status) == ("hang", None)
        assert (tried[-1].action, tried[-1].status) == ("forward", 200)
        rule.release()
    got = bucket.get("k/slow")
    assert got is not None and got.body == b"v1"


def _direct_to(endpoint: str, ca_certs: str | None = None) -> DirectS3:
    credentials = botocore.credentials.Credentials("key", "secret")
    return DirectS3(endpoint, "us-east-1", credentials, timeout=2.0, ca_certs=ca_certs)


def _self_signed(tmp_path: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


def test_the_direct_path_speaks_tls_and_checks_the_certificate(tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    store = RawServer(OK_HEAD + b"Content-Length: 4\r\n\r\nbody", tls=context)
    try:
        got = _direct_to(store.url, ca_certs=str(cert)).get("bench", "k/obj")
        assert got is not None and got.body == b"body"
        # Against the system's authorities the self-signed store is refused, never read.
        with pytest.raises(Undecided, match="CERTIFICATE_VERIFY_FAILED"):
            _direct_to(store.url).get("bench", "k/obj")
        assert len(store.requests) == 1
    finally:
        store.close()


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        # A body cut short: only a body whose declared length arrived whole is ever taken
        # for an object (a short batch would read as a torn one).
        (OK_HEAD + b"Content-Length: 100\r\n\r\n" + b"x" * 10, "closed mid-answer"),
        # No declared length: the end of the body cannot be told from a cut.
        (OK_HEAD + b"Connection: close\r\n\r\nxxxx", "no declared length"),
        (OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n4\r\nxxxx\r\n0\r\n\r\n", "encoding"),
        (OK_HEAD + b"Content-Length: 4\r\nContent-Length: 5\r\n\r\nxxxx", "conflicting"),
        (OK_HEAD + b"Content-Length: 2\r\n\r\nxxxx", "beyond the declared body"),
        (OK_HEAD + "Content-Length: \u00b2\r\n\r\nxx".encode("latin-1"), "no declared length"),
        (b"HTTP/1.1 100 Continue\r\n\r\n" + OK_HEAD + b"Content-Length: 0\r\n\r\n", "final"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nxxxx", "without an ETag"),
        (b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n", "GET answered 404"),
        (b"HTTP/1.1 200 OK\r\n" + b"X-Pad: " + b"p" * 70_000, "header block over"),
        (b"not http at all\r\n\r\n", "status line"),
        (b"HTTP/1.1 200 OK\r\nbroken header\r\n\r\n", "malformed header"),
        (b"", "closed before an answer"),
    ],
)
def test_an_answer_that_is_not_clean_is_never_taken(answer: bytes, reason: str) -> None:
    store = RawServer(answer)
    try:
        with pytest.raises(Undecided, match=reason):
            _direct_to(store.url).get("bench", "k/whole")
    finally:
        store.close()


def test_credentials_that_fail_to_refresh_leave_the_request_to_boto3() -> None:
    # boto3 then raises its own classified error (StoreCredentialsError through failure()).
    class Expired:
        def get_frozen_credentials(self) -> Any:
            raise botocore.exceptions.CredentialRetrievalError(provider="test", error_msg="gone")

    store = RawServer(OK_HEAD + b"Content-Length: 0\r\n\r\n")
    try:
        direct = DirectS3(store.url, "us-east-1", Expired(), timeout=2.0)
        with pytest.raises(Undecided, match="could not be signed"):
            direct.get("bench", "k/obj")
        assert store.requests == []  # nothing was sent
    finally:
        store.close()


def test_a_connection_the_store_closed_while_idle_is_replaced() -> None:
    # This store closes every connection after one answer, without saying so: the next
    # request finds its pooled connection closed before any answer, and is sent again on a
    # new one rather than left to boto3.
    store = RawServer(OK_HEAD + b"Content-Length: 4\r\n\r\nbody")
    direct = _direct_to(store.url)
    try:
        for _ in range(3):
            got = direct.get("bench", "k/obj")
            assert got is not None and got.body == b"body"
        assert len(store.requests) == 3
    finally:
        store.close()


@pytest.mark.parametrize(
    "body",
    [
        b"<Error><Code>InternalError</Code></Error>",
        b"<ListBucketResult><IsTruncated>true</IsTruncated></ListBucketResult>",
        b"<ListBucketResult><Contents><Key>a</Key><LastModified>yesterday</LastModified>"
        b"</Contents></ListBucketResult>",
        b"<ListBucketResult><Contents><Key>a</Key>",
    ],
)
def test_a_listing_that_is_not_clean_is_never_taken(body: bytes) -> None:
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    store = RawServer(answer)
    try:
        with pytest.raises(Undecided, match="unreadable page"):
            _direct_to(store.url).list_page("bench", "cells/")
    finally:
        store.close()


def test_direct_listings_page_like_boto3(s3_endpoint: str, request: pytest.FixtureRequest) -> None:
    store = request.node.callspec.params["s3_endpoint"]  # "seaweed" or "moto"
    bucket = make_s3_bucket(s3_endpoint, prefix="fleet")
    names = [*KEYS, *(f"cells/Counter:{n}/own.json" for n in range(7))]
    for key in names:
        bucket.put(key, b"x" * len(key))

    def both(**args: Any) -> tuple[list[ListPage], list[ListPage]]:
        assert bucket._direct is not None
        direct, boto = [], []
        with BotoSends(bucket._plain) as sends:
            token = None
            while True:
                page = bucket._direct.list_page(bucket.bucket, "fleet/", token=token, **args)
                direct.append(page)
                if page.next_token is None:
                    break
                token = page.next_token
            assert sends.count == 0
        token = None
        while True:
            page = bucket._boto3_page("", "fleet/", token, args.get("delimiter"), None, 3)
            boto.append(page)
            if page.next_token is None:
                return direct, boto
            token = page.next_token

    direct, boto = both(max_keys=3)
    assert len(direct) == len(boto) == -(-len(names) // 3)  # pages of 3
    assert [p.objects for p in direct] == [p.objects for p in boto]
    assert {o.key for p in direct for o in p.objects} == {"fleet/" + k for k in names}
    direct, boto = both(max_keys=3, delimiter="/")
    assert [p.folders for p in direct] == [p.folders for p in boto]
    assert {f for p in direct for f in p.folders} == {"fleet/cells/", "fleet/odd/"}
    # Through the bucket: every page direct, and the same answers as boto3's paginator.
    with BotoSends(bucket._plain) as sends:
        listed = list(bucket.list(""))
        folders = list(bucket.list_folders("cells/"))
        # moto's server answers 500 to the cursor's U+FFFF (S3 and SeaweedFS take it).
        after = (
            list(bucket.list_folders("cells/", start_after="Counter:3")) if store != "moto" else []
        )
    assert sends.count == 0
    assert sorted(info.key for info in listed) == sorted(names)
    assert all(info.size == len(info.key) and info.last_modified_ms > 0 for info in listed)
    assert sorted(folders) == sorted({k.split("/")[1] for k in names if k.startswith("cells/")})
    if store != "moto":
        assert after == [name for name in sorted(folders) if name > "Counter:3"]
        assert after[:3] == ["Counter:4", "Counter:5", "Counter:6"]


def test_a_listing_page_that_fails_is_listed_again_through_boto3(proxy: FaultProxy) -> None:
    bucket = make_s3_bucket(proxy.endpoint)
    for n in range(5):
        bucket.put(f"cells/c{n}/own.json", b"{}")
    # The second page fails on the direct path: boto3 lists that page (and only that one)
    # again from the same continuation token, and nothing is listed twice or left out.
    pages = bucket._pages("cells/", "cells/", max_keys=2)
    first = next(pages)
    rule = proxy.fail(500, "InternalError", kind="list", times=1)
    with BotoSends(bucket._plain) as sends:
        rest = list(pages)
    assert rule.applied == 1 and sends.count == 1
    listed = [o.key for p in [first, *rest] for o in p.objects]
    assert listed == [f"cells/c{n}/own.json" for n in range(5)]
    assert [r.status for r in proxy.requests(kind="list")] == [200, 500, 200, 200]
