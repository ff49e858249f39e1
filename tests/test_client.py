"""The Python client against the real apps (uvicorn on loopback) around fake nodes."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from cellactors.client import Client, error_from_answer
from cellactors.errors import (
    ActivationFailed,
    BadRequest,
    BadResult,
    CallError,
    KeyConflict,
    MethodFailed,
    NodeStorageFault,
    NodeUnavailable,
    NotDurable,
    PayloadTooLarge,
    StaleRoute,
    UnknownCell,
)
from cellactors.persistence.store.embedded import free_port
from tests.helpers.fake_node import FakeNode, Served, serving


@pytest.fixture
def served() -> Iterator[Served]:
    with serving(FakeNode("node-a")) as s:
        yield s


def dead_url() -> str:
    return f"http://127.0.0.1:{free_port()}"


def test_cell_handle_calls_and_returns_results(served: Served) -> None:
    with Client(served.public) as client:
        counter = client.cell("Counter", "a")
        assert counter.increment(by=2) == 2
        assert counter.increment() == 3
        assert client.call("Counter", "a", "echo", blob=b"\x00\xff", x=[1]) == {
            "blob": b"\x00\xff",
            "x": [1],
        }
    assert served.node.calls[0] == ("Counter", "a", "increment", {"by": 2}, False)


def test_msgpack_encoding(served: Served) -> None:
    with Client([served.public], encoding="msgpack") as client:
        assert client.cell("Counter", "m").echo(blob=b"\x01", n=1) == {"blob": b"\x01", "n": 1}
        with pytest.raises(MethodFailed):
            client.cell("Counter", "m").fail()


def test_dead_first_url_is_skipped(served: Served) -> None:
    with Client([dead_url(), served.public]) as client:
        assert client.cell("Counter", "a").whoami() == "node-a"
    assert len(served.node.calls) == 1


def test_all_urls_dead_raises_node_unavailable() -> None:
    with (
        Client([dead_url(), dead_url()], retry_for=0.3) as client,
        pytest.raises(NodeUnavailable) as info,
    ):
        client.cell("Counter", "a").whoami()
    assert isinstance(info.value.__cause__, httpx.ConnectError)


def test_not_durable_is_retried_under_one_key(served: Served) -> None:
    served.node.flaky_failures = 1
    with Client([served.public, served.public], backoff=0.01) as client:
        assert client.cell("Counter", "a").flaky() == "ok"
        assert client.cell("Counter", "a").flaky() == "ok"
    assert len(served.node.calls) == 3
    first, retry, other = served.node.keys
    assert first is not None
    assert retry == first  # the retry of one logical call reuses its key
    assert other is not None
    assert other != first  # the next logical call has its own


def test_without_keys_not_durable_is_not_retried(served: Served) -> None:
    served.node.flaky_failures = 1
    with (
        Client([served.public, served.public], idempotency_keys=False) as client,
        pytest.raises(NotDurable) as info,
    ):
        client.cell("Counter", "a").flaky()
    assert info.value.retryable is False
    assert info.value.outcome == "unknown"
    assert served.node.keys == [None]  # no key sent, tried once


def test_method_failed_carries_type_and_message(served: Served) -> None:
    with Client(served.public) as client, pytest.raises(MethodFailed) as info:
        client.cell("Counter", "a").fail()
    assert info.value.exc_type == "ValueError"
    assert info.value.exc_message == "bad input"
    assert info.value.status == 422
    assert len(served.node.calls) == 1


def test_client_errors_map_to_classes_and_are_not_retried(served: Served) -> None:
    with Client([served.public, served.public], idempotency_keys=False) as client:
        with pytest.raises(UnknownCell):
            client.cell("Nope", "a").increment()
        with pytest.raises(UnknownCell):
            client.cell("Counter", "a").missing()
        with pytest.raises(BadRequest, match="cell id"):
            client.cell("Counter", "a b").increment()
        with pytest.raises(CallError) as info:
            client.cell("Counter", "a").crash()
        assert info.value.code == "internal"
        assert info.value.status == 500
    assert [c[2] for c in served.node.calls] == ["missing", "crash"]  # each tried once


def test_oversized_call_is_payload_too_large(served: Served) -> None:
    with Client(served.public) as client, pytest.raises(PayloadTooLarge) as info:
        client.cell("Counter", "a").echo(x="a" * (2 << 20))
    assert isinstance(info.value, BadRequest)
    assert info.value.status == 413


def test_draining_node_fails_over_to_the_next() -> None:
    with serving(FakeNode("node-a")) as a, serving(FakeNode("node-b")) as b:
        a.node.status = "draining"
        with Client([a.public, b.public]) as client:
            results = {client.cell("Counter", "a").whoami() for _ in range(4)}
        assert results == {"node-b"}
        assert len(a.node.calls) >= 1  # some calls started at node-a and were retried
        a.node.status = "serving"


def test_unknown_outcome_after_retries_is_retried_with_its_key(served: Served) -> None:
    """An internal error (500) has an unknown outcome: retried under the call's key."""
    with Client([served.public], max_attempts=3, backoff=0.01) as client:
        with pytest.raises(CallError) as info:
            client.cell("Counter", "a").crash()
        assert info.value.code == "internal"
        assert info.value.outcome == "unknown"
    assert len(served.node.calls) == 3
    assert len(set(served.node.keys)) == 1


def test_read_timeout_is_not_retried_without_keys(served: Served) -> None:
    other = FakeNode("node-b")
    with (
        serving(other) as b,
        Client([served.public, b.public], timeout=0.3, idempotency_keys=False) as client,
    ):
        with pytest.raises(NotDurable, match="outcome unknown") as info:
            client.call("Counter", "a", "wait")
        assert isinstance(info.value.__cause__, httpx.ReadTimeout)
        served.node.gate.set()
        # Whichever node got the call, the other one never saw it.
        assert len(served.node.calls) + len(other.calls) == 1


def test_read_timeout_is_retried_under_the_same_key() -> None:
    with serving(FakeNode("node-a")) as a, serving(FakeNode("node-b")) as b:
        b.node.gate.set()  # only node-a blocks
        with Client([a.public, b.public], timeout=0.3, backoff=0.01) as client:
            results = [client.call("Counter", "x", "wait") for _ in range(2)]
        assert results == ["released", "released"]
        a.node.gate.set()
        assert len(b.node.calls) == 2
        assert len(a.node.calls) == 1  # one call timed out there, then went to node-b
        assert a.node.keys[0] in b.node.keys  # ... under the key it had at node-a


@pytest.mark.parametrize(
    ("payload", "cls"),
    [
        ({"error": "node_unavailable", "message": "m", "retryable": True}, NodeUnavailable),
        ({"error": "activation_failed", "message": "m", "retryable": True}, ActivationFailed),
        ({"error": "storage_unavailable", "message": "m", "retryable": True}, NodeStorageFault),
        ({"error": "stale_route", "message": "m", "retryable": True}, StaleRoute),
        ({"error": "not_durable", "message": "m", "retryable": True}, NotDurable),
        ({"error": "bad_request", "message": "m", "retryable": False}, BadRequest),
        ({"error": "bad_result", "message": "m", "outcome": "failed"}, BadResult),
        ({"error": "key_conflict", "message": "m", "outcome": "not_run"}, KeyConflict),
    ],
)
def test_error_codes_map_to_classes(payload: dict[str, object], cls: type[CallError]) -> None:
    err = error_from_answer(503, payload)
    assert type(err) is cls
    assert str(err) == "m"


def test_unknown_error_codes_keep_status_and_code() -> None:
    err = error_from_answer(418, {"error": "teapot", "message": "no", "retryable": False})
    assert type(err) is CallError
    assert (err.status, err.code, err.retryable) == (418, "teapot", False)
    odd = error_from_answer(502, "<html>bad gateway</html>")
    assert odd.status == 502
    assert "bad gateway" in str(odd)


def test_client_needs_a_url() -> None:
    with pytest.raises(ValueError):
        Client([])
