"""Conditional PUTs on the direct S3 path: they verify and classify on real stores without
boto3, and are never sent a second time once they may have reached the store. Sent again
after a silent apply, a create would be refused by its own write and read as lost, so every
answer that does not come back whole is an ambiguous write, and only a request that never
left (or that the store refused as a request) goes to boto3."""

from __future__ import annotations

import resource
import socket
from typing import Any

import pytest

from cellactors.errors import AmbiguousWrite, Fenced
from cellactors.persistence.store.bucket import Absent, Applied, Match, Rejected
from cellactors.persistence.store.gate import GatedBucket
from cellactors.persistence.store.keepalive import Connection, StaleConnection
from cellactors.persistence.store.s3 import S3Bucket
from tests.faults.proxy import FaultProxy
from tests.helpers.boto_sends import OK_HEAD, BotoSends
from tests.helpers.raw_server import RawServer
from tests.helpers.runtime import eventually
from tests.helpers.stores import make_s3_bucket

KEY = "cells/Counter:a/own.json"


def test_conditional_puts_verify_and_classify_on_real_stores_without_boto3(
    s3_endpoint: str,
) -> None:
    bucket = make_s3_bucket(s3_endpoint, prefix="fleet")
    with BotoSends(bucket._cas) as sends:
        answers = bucket.clock.answers
        created = bucket.put_cas(KEY, b"v1", Absent())
        assert isinstance(created, Applied)
        assert bucket.clock.answers > answers  # its Date fed the store's clock
        assert isinstance(bucket.put_cas(KEY, b"again", Absent()), Rejected)
        updated = bucket.put_cas(KEY, b"v2", Match(created.token))
        assert isinstance(updated, Applied)
        assert isinstance(bucket.put_cas("cells/none/own.json", b"x", Match('"e"')), Rejected)
        assert sends.count == 0
    # The stale token's rejection is also checked for ETag spelling (a HEAD through boto3).
    assert isinstance(bucket.put_cas(KEY, b"v3", Match(created.token)), Rejected)
    got = bucket.get(KEY)
    assert (
        got is not None and got.body == b"v2" and got.token.strip('"') == updated.token.strip('"')
    )


@pytest.mark.parametrize("guard", ["absent", "match"])
def test_a_conditional_put_the_store_applied_but_never_answered_is_ambiguous_and_sent_once(
    proxy: FaultProxy, guard: str
) -> None:
    bucket = make_s3_bucket(proxy.endpoint)
    condition = (
        Absent() if guard == "absent" else Match(_token(bucket.put_cas(KEY, b"v1", Absent())))
    )
    proxy.apply_then_drop(method="PUT", key=f"^{KEY}$", times=1)
    with BotoSends(bucket._cas) as sends, pytest.raises(AmbiguousWrite, match="sent, then"):
        bucket.put_cas(KEY, b"v2", condition)
    assert sends.count == 0
    puts = proxy.requests(method="PUT", key=f"^{KEY}$")
    assert [(r.applied, r.status) for r in puts][-1] == (True, None)
    assert len(puts) == (1 if guard == "absent" else 2)  # the create before, for "match"
    got = bucket.get(KEY)
    assert got is not None and got.body == b"v2"  # it was applied: only read-back can tell


@pytest.mark.parametrize("status", [500, 503, 408, 422, 429, 499])
def test_an_answer_that_is_not_a_known_refusal_is_ambiguous_and_never_sent_again(
    proxy: FaultProxy, status: int
) -> None:
    # A 5xx, and a timeout, a client that gave up or a throttle, which a proxy may answer
    # after the store applied the write. Only a known refusal (a redirect, a refused
    # signature) means nothing was applied.
    bucket = make_s3_bucket(proxy.endpoint)
    proxy.fail(status, "InternalError", method="PUT", key=f"^{KEY}$", times=1)
    with BotoSends(bucket._cas) as sends, pytest.raises(AmbiguousWrite, match=str(status)):
        bucket.put_cas(KEY, b"v1", Absent())
    assert sends.count == 0
    assert [r.status for r in proxy.requests(method="PUT", key=f"^{KEY}$")] == [status]


@pytest.mark.parametrize(
    ("answer", "applied"),
    [
        (b'HTTP/1.1 201 Created\r\nETag: "e"\r\nContent-Length: 0\r\n\r\n', True),
        (b'HTTP/1.1 204 No Content\r\nETag: "e"\r\nContent-Length: 0\r\n\r\n', True),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", False),
        (b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n", False),
    ],
)
def test_any_success_is_applied_and_never_sent_again(answer: bytes, applied: bool) -> None:
    # Without an ETag the new token is unknown: ambiguous, so the caller reads it back.
    store = RawServer(answer)
    try:
        bucket = S3Bucket("b", endpoint=store.url, access_key="k", secret_key="s", timeout=2.0)
        if applied:
            result = bucket.put_cas(KEY, b"v1", Absent())
            assert isinstance(result, Applied) and result.token == '"e"'
        else:
            with pytest.raises(AmbiguousWrite, match="without an ETag"):
                bucket.put_cas(KEY, b"v1", Absent())
        assert len(store.requests) == 1
    finally:
        store.close()


def test_a_request_the_store_refused_as_such_is_sent_again_through_boto3(
    proxy: FaultProxy,
) -> None:
    # A 403 applies nothing: boto3 sends it once more and classifies what it hears.
    bucket = make_s3_bucket(proxy.endpoint)
    proxy.fail(403, "AccessDenied", method="PUT", key=f"^{KEY}$", times=1)
    with BotoSends(bucket._cas) as sends:
        assert isinstance(bucket.put_cas(KEY, b"v1", Absent()), Applied)
    assert sends.count == 1
    assert [r.status for r in proxy.requests(method="PUT", key=f"^{KEY}$")] == [403, 200]


def test_a_conditional_put_that_hangs_is_ambiguous_at_the_timeout(proxy: FaultProxy) -> None:
    name = make_s3_bucket(proxy.endpoint).bucket
    bucket = S3Bucket(name, endpoint=proxy.endpoint, timeout=1.0)
    rule = proxy.hang(method="PUT", key=f"^{KEY}$", times=1)
    try:
        with BotoSends(bucket._cas) as sends, pytest.raises(AmbiguousWrite):
            bucket.put_cas(KEY, b"v1", Absent())
        assert sends.count == 0
        assert len(proxy.requests(method="PUT", key=f"^{KEY}$")) == 1
    finally:
        rule.release()


def test_an_idle_connection_the_store_closed_is_not_used_for_a_conditional_put() -> None:
    # This store closes every connection after one answer, without saying so. A conditional
    # PUT must not go out on a pooled connection already seen closed (its failure would come
    # only after the send, and read as ambiguous): it sends on a new connection.
    store = RawServer(OK_HEAD + b"Content-Length: 0\r\n\r\n")
    try:
        bucket = S3Bucket("b", endpoint=store.url, access_key="k", secret_key="s", timeout=2.0)
        direct = bucket._direct
        assert direct is not None
        bucket.get("k/warm")
        for _ in range(3):
            # The answered connection is back in the pool; the store's close reaches it.
            eventually(lambda: bool(direct.pool._idle) and direct.pool._idle[-1].looks_closed())
            result = bucket.put_cas(KEY, b"v1", Absent())
            assert isinstance(result, Applied) and result.token == '"e"'
        assert [line.split()[0] for line, _, _ in store.requests] == [b"GET"] + [b"PUT"] * 3
        assert all(h.get("if-none-match") == "*" for _, h, _ in store.requests[1:])
    finally:
        store.close()


def test_an_answer_the_direct_path_cannot_read_is_ambiguous_and_turns_it_off() -> None:
    # A store that answers a conditional PUT with a chunked body: the PUT left, so it may
    # have been applied (ambiguous); later conditional PUTs go through boto3, which reads it.
    chunked = OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
    store = RawServer(chunked)
    try:
        bucket = S3Bucket("b", endpoint=store.url, access_key="k", secret_key="s", timeout=2.0)
        assert bucket._direct is not None
        with pytest.raises(AmbiguousWrite, match="transfer encoding"):
            bucket.put_cas(KEY, b"v1", Absent())
        assert bucket._direct.conditional is False
        with BotoSends(bucket._cas) as sends:
            assert isinstance(bucket.put_cas(KEY, b"v1", Absent()), Applied)
        assert sends.count == 1
        assert len(store.requests) == 2
    finally:
        store.close()


def test_a_closed_gate_stops_a_conditional_put_before_the_wire(proxy: FaultProxy) -> None:
    bucket = make_s3_bucket(proxy.endpoint)
    gate = GatedBucket(bucket)
    before = len(proxy.log())
    with gate._through("PUT", KEY):  # the gate closes while a request is under way
        gate.close_gate("lease lost")
        with pytest.raises(Fenced):
            bucket.put_cas(KEY, b"v1", Absent())
    assert len(proxy.log()) == before


def _token(result: object) -> str:
    assert isinstance(result, Applied)
    return result.token


def test_an_idle_connection_is_seen_closed_past_descriptor_1024() -> None:
    # A node raises its open-files limit and holds a descriptor per active cell: the check
    # must not depend on select()'s 1024 limit (which would make every pooled connection
    # look closed, and every conditional PUT open a new one).
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.fail(f"this machine's hard open-files limit ({hard}) is below the test's need")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    filler = [socket.socket() for _ in range(1030)]
    ours, peer = socket.socketpair()
    try:
        assert ours.fileno() > 1024
        conn = Connection(ours)
        assert not conn.looks_closed()
        peer.sendall(b"x")  # bytes nobody asked for: not usable either
        eventually(conn.looks_closed)
        conn.buffer.clear()
        ours2, peer2 = socket.socketpair()
        conn2 = Connection(ours2)
        peer2.close()
        eventually(conn2.looks_closed)
        conn2.close()
    finally:
        for sock in (*filler, ours, peer):
            sock.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.parametrize("sent", [False, True])
def test_a_broken_pooled_connection_resends_only_what_never_left(
    monkeypatch: pytest.MonkeyPatch, sent: bool
) -> None:
    # The first exchange on a pooled connection fails. If the request never wholly left
    # (its send failed), it goes out once on a new connection and is applied; if it left,
    # the write is ambiguous and nothing is sent again.
    store = RawServer(OK_HEAD + b"Content-Length: 0\r\n\r\n")
    try:
        bucket = S3Bucket("b", endpoint=store.url, access_key="k", secret_key="s", timeout=2.0)
        direct = bucket._direct
        assert direct is not None
        pooled = direct.pool.connect()
        direct.pool.give(pooled)

        def broken(request: bytes) -> Any:
            pooled.close()
            raise StaleConnection("send failed: [Errno 32] Broken pipe", sent=sent)

        monkeypatch.setattr(pooled, "exchange", broken)
        monkeypatch.setattr(pooled, "looks_closed", lambda: False)  # it breaks at the send
        with BotoSends(bucket._cas) as boto:
            if sent:
                with pytest.raises(AmbiguousWrite, match="sent, then"):
                    bucket.put_cas(KEY, b"v1", Absent())
            else:
                assert isinstance(bucket.put_cas(KEY, b"v1", Absent()), Applied)
        assert boto.count == 0  # resent on the direct path's own new connection
        # (The pooled connection, closed unused, reached the store as an empty request.)
        sends = [line.split()[0] for line, _, _ in store.requests if line]
        assert sends == ([] if sent else [b"PUT"])
    finally:
        store.close()
