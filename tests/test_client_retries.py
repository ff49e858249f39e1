"""How the Python client classifies a failed attempt and how long it keeps retrying, against
real servers on loopback: the apps around fake nodes, and raw sockets that refuse, reset or
drop connections at chosen points of the request.

A node that refuses the connection, resets it while the request is being written, or
answers ``not_run`` never ran the call: retried until the deadline, and a call whose every
attempt was like that ends ``not_run``. A connection lost after the whole request was
written, or a 503 ``not_durable``, may have run: retried only under the call's key, and
reported ``unknown`` (``NotDurable``) when the retries are over.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator

import httpx
import pytest

from cellactors.client import Client
from cellactors.core.changes import Change
from cellactors.errors import NodeUnavailable, NotDurable
from cellactors.server.app import ServerSettings
from tests.helpers.fake_node import FakeNode, Served, serving
from tests.helpers.raw_server import BIG, RawServer


def ok_answer(payload: object, content_type: str = "application/json") -> bytes:
    """A whole HTTP/1.1 200 answer with ``payload`` as JSON, closing the connection."""
    body = json.dumps(payload).encode()
    return (
        f"HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body


def counting(on_request: Callable[[int], None] | None = None) -> tuple[httpx.Client, list[str]]:
    """An httpx client that records the URL of every request it sends (and calls
    ``on_request`` with the count before sending it)."""
    sent: list[str] = []

    def hook(request: httpx.Request) -> None:
        sent.append(str(request.url))
        if on_request is not None:
            on_request(len(sent))

    return httpx.Client(timeout=httpx.Timeout(10.0), event_hooks={"request": [hook]}), sent


@pytest.fixture
def served() -> Iterator[Served]:
    with serving(FakeNode("node-a")) as s:
        yield s


@pytest.fixture
def big_bodies() -> Iterator[Served]:
    """A fake node that accepts bodies as large as :data:`BIG`."""
    with serving(FakeNode("node-b"), settings=ServerSettings(max_body_bytes=64 << 20)) as s:
        yield s


@pytest.fixture
def refusing() -> Iterator[RawServer]:
    """A bound port that refuses connections until ``listen()``; then answers 7."""
    server = RawServer(reply=ok_answer({"result": 7}), listening=False)
    yield server
    server.close()


# --- refused: never sent -------------------------------------------------------------------


def test_refused_connections_are_retried_until_the_deadline_and_end_not_run(
    refusing: RawServer,
) -> None:
    http, sent = counting()
    started = time.monotonic()
    with (
        Client([refusing.url, refusing.url], retry_for=0.6, backoff=0.01, http=http) as client,
        pytest.raises(NodeUnavailable) as info,
    ):
        client.call("Counter", "a", "increment")
    elapsed = time.monotonic() - started
    assert info.value.outcome == "not_run"  # every attempt was refused: nothing ran
    assert isinstance(info.value.__cause__, httpx.ConnectError)
    assert elapsed >= 0.6  # it kept trying until the deadline ...
    assert len(sent) > 5  # ... with many attempts, not a fixed three
    assert elapsed < 5


def test_a_node_that_starts_listening_within_the_deadline_gets_the_call(
    refusing: RawServer,
) -> None:
    def come_up(count: int) -> None:
        if count == 4:
            refusing.listen()  # three refusals, then the node is back

    http, sent = counting(come_up)
    with Client(refusing.url, retry_for=10.0, backoff=0.01, http=http) as client:
        assert client.call("Counter", "a", "increment") == 7
    assert len(sent) == 4
    assert len(refusing.requests) == 1


def test_retry_for_zero_sends_once(refusing: RawServer) -> None:
    http, sent = counting()
    with (
        Client([refusing.url, refusing.url], retry_for=0, http=http) as client,
        pytest.raises(NodeUnavailable),
    ):
        client.call("Counter", "a", "increment")
    assert len(sent) == 1


def test_max_attempts_still_caps_the_attempts(refusing: RawServer) -> None:
    http, sent = counting()
    with (
        Client(refusing.url, retry_for=30.0, max_attempts=4, backoff=0.01, http=http) as client,
        pytest.raises(NodeUnavailable),
    ):
        client.call("Counter", "a", "increment")
    assert len(sent) == 4


# --- a pooled connection whose node died: found dead before the request is written ---------


def test_a_pooled_connection_to_a_node_that_went_away_is_not_run() -> None:
    """The first answer keeps its connection in the pool (no ``Connection: close``); the
    server closes it and goes away. httpcore finds the pooled connection readable (closed by
    the peer) before writing, drops it and connects anew: refused, so nothing was sent."""
    body = b'{"result": 1}'
    keep_alive = (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    server = RawServer(reply=keep_alive)
    http, sent = counting()
    with Client(server.url, retry_for=0.3, backoff=0.01, idempotency_keys=False, http=http) as c:
        assert c.call("Counter", "a", "increment") == 1
        server.close()
        with pytest.raises(NodeUnavailable) as info:
            c.call("Counter", "a", "increment")
    assert info.value.outcome == "not_run"
    assert isinstance(info.value.__cause__, httpx.ConnectError)
    assert len(sent) > 2  # not run, so retried even without a key
    assert len(server.requests) == 1


# --- reset while the request is written: never whole at the node --------------------------


def test_a_reset_while_the_request_is_written_is_not_run_and_retried_without_a_key(
    big_bodies: Served,
) -> None:
    """The node reads the head and resets the connection: the body cannot all be written,
    so the node never had the request whole. httpcore hides that write error and reports
    the read after it; only its trace of the failed write shows the call is ``not_run``.
    So even without a key it is retried, on the next node, where it runs once."""
    resetter = RawServer(mode="reset_after_head")
    try:
        with Client(
            [resetter.url, big_bodies.public], idempotency_keys=False, backoff=0.01
        ) as client:
            assert client.call("Counter", "a", "echo", x=BIG) == {"x": BIG}
        assert resetter.heads == 1
        assert resetter.requests == []  # it never read a whole request
        assert len(big_bodies.node.calls) == 1
        assert big_bodies.node.keys == [None]
    finally:
        resetter.close()


def test_resets_while_writing_on_every_node_end_not_run() -> None:
    resetter = RawServer(mode="reset_after_head")
    try:
        with (
            Client(resetter.url, retry_for=0.3, backoff=0.01, idempotency_keys=False) as client,
            pytest.raises(NodeUnavailable, match="before the request was sent") as info,
        ):
            client.call("Counter", "a", "echo", x=BIG)
        assert info.value.outcome == "not_run"
        assert resetter.heads > 1
        assert resetter.requests == []
    finally:
        resetter.close()


# --- dropped after the whole request was written: may have run -----------------------------


@pytest.mark.parametrize("mode", ["answer", "reset_after_request"])
def test_a_connection_lost_after_the_request_is_unknown(served: Served, mode: str) -> None:
    """Closed (FIN) or reset (RST) after the node read the whole request: it may have run.
    Without a key: raised at once as ``NotDurable``; with one: retried under it."""
    dropper = RawServer(mode=mode)  # type: ignore[arg-type]
    try:
        with (
            Client([dropper.url, served.public], idempotency_keys=False) as client,
            pytest.raises(NotDurable, match="may have run") as info,
        ):
            client.call("Counter", "a", "increment", by=1)
        assert info.value.outcome == "unknown"
        assert len(dropper.requests) == 1 and served.node.calls == []
        with Client([dropper.url, served.public], backoff=0.01) as client:
            assert client.call("Counter", "a", "increment", by=1) == 1
        [_, (_, headers, _)] = dropper.requests
        assert served.node.keys == [headers["idempotency-key"]]
    finally:
        dropper.close()


# --- answers: 503 not_run and 503 unknown --------------------------------------------------


def test_a_node_answering_not_run_for_a_while_is_ridden_out(served: Served) -> None:
    """``node_unavailable`` (503, ``not_run``), as a live node answers while the owner's
    lease has not expired yet, for more attempts than the old fixed three."""
    served.node.status = "draining"

    def recover(count: int) -> None:
        if count == 6:
            served.node.status = "serving"

    http, sent = counting(recover)
    with Client(served.public, retry_for=10.0, backoff=0.01, http=http) as client:
        assert client.call("Counter", "a", "increment") == 1
    assert len(sent) == 6
    assert served.node.counters == {"a": 1}


def test_not_run_answers_until_the_deadline_end_not_run(served: Served) -> None:
    served.node.status = "draining"
    with (
        Client(served.public, retry_for=1.0, backoff=0.01) as client,
        pytest.raises(NodeUnavailable) as info,
    ):
        client.call("Counter", "a", "increment")
    assert info.value.outcome == "not_run"
    assert len(served.node.calls) > 3


def test_unknown_answers_are_retried_under_the_key_until_one_succeeds(served: Served) -> None:
    served.node.flaky_failures = 6  # six 503 not_durable answers, then the call runs
    with Client(served.public, retry_for=10.0, backoff=0.01) as client:
        assert client.call("Counter", "a", "flaky") == "ok"
    assert len(served.node.calls) == 7
    assert len(set(served.node.keys)) == 1


def test_unknown_answers_until_the_deadline_end_not_durable(served: Served) -> None:
    served.node.flaky_failures = 10_000
    with (
        Client(served.public, retry_for=0.3, backoff=0.01) as client,
        pytest.raises(NotDurable) as info,
    ):
        client.call("Counter", "a", "flaky")
    assert info.value.outcome == "unknown"
    assert len(served.node.calls) > 3


def test_an_unknown_attempt_then_refusals_end_not_durable(served: Served) -> None:
    """Once an attempt may have run, the call ends ``unknown`` even if every later attempt
    was ``not_run`` (refused, or answered ``node_unavailable``)."""
    served.node.flaky_failures = 1  # the first attempt: 503 not_durable

    def drain(count: int) -> None:
        if count == 2:
            served.node.status = "draining"

    http, _ = counting(drain)
    dropped = RawServer(listening=False)
    try:
        with (
            Client([served.public, dropped.url], retry_for=0.3, backoff=0.01, http=http) as client,
            pytest.raises(NotDurable, match="earlier attempt may have run") as info,
        ):
            client.call("Counter", "a", "flaky")
        assert isinstance(info.value.__cause__, NodeUnavailable)
        assert len(served.node.calls) > 1
    finally:
        dropped.close()


# --- the change feed: the same deadline ----------------------------------------------------


def test_the_feed_retries_a_refused_node_until_the_deadline(refusing: RawServer) -> None:
    http, sent = counting()
    started = time.monotonic()
    with (
        Client(refusing.url, retry_for=0.5, backoff=0.01, http=http) as client,
        pytest.raises(NodeUnavailable),
    ):
        list(client.changes("Counter", "a"))
    assert time.monotonic() - started >= 0.5
    assert len(sent) > 3


def test_the_feed_rides_out_a_node_that_comes_back() -> None:
    change = Change(txid=3, epoch=1, ts_ms=1_700_000_000_000, schema_change=False, rows=())
    line = json.dumps(change.to_wire()).encode() + b"\n"
    answer = (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\n"
        b"Content-Length: " + str(len(line)).encode() + b"\r\nConnection: close\r\n\r\n" + line
    )
    server = RawServer(reply=answer, listening=False)

    def come_up(count: int) -> None:
        if count == 5:
            server.listen()

    http, sent = counting(come_up)
    try:
        with Client(server.url, retry_for=10.0, backoff=0.01, http=http) as client:
            assert [c.txid for c in client.changes("Counter", "a")] == [3]
        assert len(sent) == 5
    finally:
        server.close()
