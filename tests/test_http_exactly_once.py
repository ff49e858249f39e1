"""Exactly-once calls over HTTP: every answer says whether the call ran, only ``not_run``
answers are re-routed or retried without a key, idempotency keys travel (signed) to the
owner, and signed forwards cannot be replayed against a restarted receiver.

Real uvicorn servers on loopback around the fake nodes of ``tests.test_server_app``, plus a
raw socket "node" for failures a real server does not produce on demand.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import msgpack
import pytest

from cellactors.client import Client
from cellactors.errors import (
    UNKNOWN,
    BadResult,
    KeyConflict,
    NodeUnavailable,
    NotDurable,
    RemoteOwner,
)
from cellactors.persistence.store.embedded import free_port
from cellactors.server import signing
from tests.helpers.fake_node import (
    KEY,
    WAIT,
    FakeNode,
    Served,
    owner_route,
    post,
    serving,
    signed_post,
)
from tests.helpers.raw_server import RawServer


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=WAIT) as client:
        yield client


@pytest.fixture
def pair() -> Iterator[tuple[Served, Served]]:
    with serving(FakeNode("node-a")) as a, serving(FakeNode("node-b")) as b:
        yield a, b


@pytest.fixture
def dropper() -> Iterator[RawServer]:
    node = RawServer()
    yield node
    node.close()


# --- the public listener re-routes only when the call ran nowhere -------------------------


def test_owner_unavailable_not_run_is_rerouted(
    pair: tuple[Served, Served], http: httpx.Client
) -> None:
    a, b = pair
    a.node.routes = [owner_route(b)]
    b.node.status = "draining"  # answers node_unavailable, not_run
    r = post(http, a.public, "/cells/Counter/d/whoami", {})
    assert r.status_code == 200
    assert r.json() == {"result": "node-a"}  # routed again, ran here
    assert a.node.forgotten == [("Counter", "d")]
    b.node.status = "serving"


def test_owner_not_durable_is_passed_through_never_rerouted(
    pair: tuple[Served, Served], http: httpx.Client
) -> None:
    a, b = pair
    a.node.routes = [owner_route(b)] * 2
    r = post(http, a.public, "/cells/Counter/d/not_durable", {})
    assert r.status_code == 503
    assert r.json()["error"] == "not_durable"
    assert r.json()["outcome"] == "unknown"
    assert r.headers["x-cellactors-node"] == "node-b"
    assert a.node.forgotten == []
    assert len(b.node.calls) == 1
    assert len(a.node.calls) == 1  # one routing decision, no second hop


class HeldAtFence(NodeUnavailable):
    """An owner answering node_unavailable for a call that may have been applied."""

    outcome = UNKNOWN


def test_owner_unavailable_with_unknown_outcome_is_not_rerouted(
    pair: tuple[Served, Served], http: httpx.Client
) -> None:
    a, b = pair

    def held(node: FakeNode, name: str, kwargs: dict[str, Any]) -> None:
        raise HeldAtFence("fenced while the answer was held")

    b.node.methods["held"] = held
    a.node.routes = [owner_route(b)] * 2
    r = post(http, a.public, "/cells/Counter/d/held", {})
    assert r.status_code == 503
    assert r.json()["error"] == "node_unavailable"
    assert r.json()["outcome"] == "unknown"
    assert a.node.forgotten == []
    assert len(b.node.calls) == 1  # applied at most once: never sent anywhere else


def test_owner_fenced_while_holding_the_answer_is_unknown(
    pair: tuple[Served, Served], http: httpx.Client
) -> None:
    a, b = pair
    b.node.answering = False
    a.node.routes = [owner_route(b)] * 2
    r = post(http, a.public, "/cells/Counter/d/increment", {})
    assert r.status_code == 503
    assert r.json()["error"] == "not_durable"
    assert r.json()["outcome"] == "unknown"
    assert b.node.counters == {"d": 1}  # it did run there
    assert a.node.forgotten == []


def test_owner_dropping_the_connection_after_the_request_is_unknown(
    served: Served, dropper: RawServer, http: httpx.Client
) -> None:
    served.node.routes = [RemoteOwner("node-x", dropper.url, "gen-x")] * 2
    r = post(
        http, served.public, "/cells/Counter/d/increment", {}, headers={"Idempotency-Key": "k"}
    )
    assert r.status_code == 503
    assert r.json()["error"] == "not_durable"
    assert r.json()["outcome"] == "unknown"
    assert len(dropper.requests) == 1  # it got the whole request
    assert served.node.forgotten == []


def test_owner_answering_without_an_error_body_is_unknown(
    served: Served, http: httpx.Client
) -> None:
    plain = RawServer(
        b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: text/plain\r\n"
        b"content-length: 21\r\nconnection: close\r\n\r\nInternal Server Error"
    )
    try:
        served.node.routes = [RemoteOwner("node-x", plain.url, "gen-x")] * 2
        r = post(http, served.public, "/cells/Counter/d/increment", {})
    finally:
        plain.close()
    assert r.status_code == 503
    assert r.headers["content-type"] == "application/json"
    assert r.json()["error"] == "not_durable"
    assert r.json()["outcome"] == "unknown"
    assert served.node.forgotten == []


@pytest.fixture
def served() -> Iterator[Served]:
    with serving(FakeNode("node-a")) as s:
        yield s


# --- idempotency keys over HTTP ---------------------------------------------------------------


def test_key_is_passed_to_the_local_node(served: Served, http: httpx.Client) -> None:
    r = post(
        http, served.public, "/cells/Counter/a/increment", {}, headers={"Idempotency-Key": "k1"}
    )
    assert r.json() == {"result": 1}
    again = post(
        http, served.public, "/cells/Counter/a/increment", {}, headers={"Idempotency-Key": "k1"}
    )
    assert again.json() == {"result": 1}  # the fake answers the recorded key
    assert served.node.keys == ["k1", "k1"]
    assert served.node.counters == {"a": 1}
    plain = post(http, served.public, "/cells/Counter/a/increment", {})
    assert plain.json() == {"result": 2}
    assert served.node.keys[-1] is None


def test_key_reused_with_other_arguments_is_409(served: Served, http: httpx.Client) -> None:
    headers = {"Idempotency-Key": "k1"}
    assert post(http, served.public, "/cells/Counter/a/increment", {}, headers=headers).is_success
    r = post(http, served.public, "/cells/Counter/a/increment", {"by": 5}, headers=headers)
    assert r.status_code == 409
    assert r.json()["error"] == "key_conflict"
    assert r.json()["outcome"] == "not_run"
    assert r.json()["retryable"] is False
    assert served.node.counters == {"a": 1}


@pytest.mark.parametrize("bad", ["", "a b", "k" * 129, "x/y", "é"])
def test_invalid_keys_are_400_before_the_node(served: Served, http: httpx.Client, bad: str) -> None:
    r = http.post(
        served.public + "/cells/Counter/a/increment",
        content=b"{}",
        headers=[(b"Idempotency-Key", bad.encode("utf-8")), (b"Content-Type", b"application/json")],
    )
    assert r.status_code == 400
    assert r.json()["error"] == "bad_request"
    assert "Idempotency-Key" in r.json()["message"]
    assert served.node.calls == []


def test_repeated_key_header_is_400(served: Served, http: httpx.Client) -> None:
    r = http.post(
        served.public + "/cells/Counter/a/increment",
        content=b"{}",
        headers=[
            ("Idempotency-Key", "k1"),
            ("Idempotency-Key", "k2"),
            ("Content-Type", "application/json"),
        ],
    )
    assert r.status_code == 400
    assert served.node.calls == []


def test_key_reaches_the_owner_through_a_forward(
    pair: tuple[Served, Served], http: httpx.Client
) -> None:
    a, b = pair
    a.node.routes = [owner_route(b)]
    r = post(
        http, a.public, "/cells/Counter/c/increment", {"by": 3}, headers={"Idempotency-Key": "k-7"}
    )
    assert r.json() == {"result": 3}
    assert a.node.keys == ["k-7"]  # the routing attempt here
    assert b.node.keys == ["k-7"]
    assert b.node.calls == [("Counter", "c", "increment", {"by": 3}, True)]


def test_one_key_through_two_ingress_nodes_runs_once(http: httpx.Client) -> None:
    with (
        serving(FakeNode("node-a")) as a,
        serving(FakeNode("node-b")) as b,
        serving(FakeNode("node-c")) as c,
    ):
        a.node.routes = [owner_route(b)]
        c.node.routes = [owner_route(b)]
        headers = {"Idempotency-Key": "order-17"}
        first = post(http, a.public, "/cells/Counter/c/increment", {}, headers=headers)
        second = post(http, c.public, "/cells/Counter/c/increment", {}, headers=headers)
        assert first.json() == second.json() == {"result": 1}
        assert b.node.counters == {"c": 1}
        assert b.node.keys == ["order-17", "order-17"]


def test_internal_key_header_is_covered_by_the_signature(
    served: Served, http: httpx.Client
) -> None:
    path = "/internal/cells/Counter/a/increment"
    headers = signing.sign_request(
        KEY,
        "POST",
        path,
        b"{}",
        source="node-z",
        target="node-a",
        target_generation=served.node.generation,
        idempotency_key="k1",
    )
    tampered = {**headers, "Idempotency-Key": "k2"}
    r = http.post(served.internal + path, content=b"{}", headers=tampered)
    assert r.status_code == 401
    assert "bad signature" in r.json()["message"]
    assert r.json()["outcome"] == "not_run"
    assert served.node.calls == []
    ok = http.post(served.internal + path, content=b"{}", headers=headers)
    assert ok.status_code == 200
    assert served.node.keys == ["k1"]


def test_internal_refuses_a_malformed_signed_key(served: Served, http: httpx.Client) -> None:
    r = signed_post(http, served, "increment", idempotency_key="bad key")
    assert r.status_code == 400
    assert r.json()["error"] == "bad_request"
    assert served.node.calls == []


# --- results the encoding cannot carry are rolled back -----------------------------------------


def test_nan_result_is_422_bad_result(served: Served, http: httpx.Client) -> None:
    r = post(http, served.public, "/cells/Counter/a/nan", {}, headers={"Idempotency-Key": "k"})
    assert r.status_code == 422
    assert r.json()["error"] == "bad_result"
    assert r.json()["outcome"] == "failed"
    assert r.json()["retryable"] is False
    [(result, refusal)] = served.node.checks
    assert result != result  # NaN
    assert isinstance(refusal, ValueError)
    assert "k" not in served.node.recorded  # rolled back: nothing recorded


def test_nan_result_is_fine_in_msgpack(served: Served, http: httpx.Client) -> None:
    r = http.post(
        served.public + "/cells/Counter/a/nan",
        content=msgpack.packb({}),
        headers={"Content-Type": "application/msgpack"},
    )
    assert r.status_code == 200
    value = msgpack.unpackb(r.content)["result"]
    assert value != value


def test_too_big_integer_in_msgpack_is_bad_result(served: Served, http: httpx.Client) -> None:
    r = http.post(
        served.public + "/cells/Counter/a/big",
        content=msgpack.packb({}),
        headers={"Content-Type": "application/msgpack"},
    )
    assert r.status_code == 422
    assert msgpack.unpackb(r.content)["error"] == "bad_result"
    assert post(http, served.public, "/cells/Counter/a/big", {}).json() == {"result": 2**70}


def test_forwarded_nan_result_is_refused_by_the_owner(
    pair: tuple[Served, Served], http: httpx.Client
) -> None:
    a, b = pair
    a.node.routes = [owner_route(b)]
    r = post(http, a.public, "/cells/Counter/a/nan", {})
    assert r.status_code == 422
    assert r.json()["error"] == "bad_result"
    assert len(b.node.checks) == 1
    assert isinstance(b.node.checks[0][1], ValueError)


# --- signed forwards are bound to the receiving process ----------------------------------------


def test_replay_against_a_restarted_receiver_is_refused(http: httpx.Client) -> None:
    path = "/internal/cells/Counter/a/increment"
    first = FakeNode("node-b")
    with serving(first) as b:
        headers = signing.sign_request(
            KEY,
            "POST",
            path,
            b"{}",
            source="node-a",
            target="node-b",
            target_generation=first.generation,
        )
        assert http.post(b.internal + path, content=b"{}", headers=headers).status_code == 200
        replay = http.post(b.internal + path, content=b"{}", headers=headers)
        assert replay.status_code == 401  # same process: the nonce cache
        assert "replayed" in replay.json()["message"]
    restarted = FakeNode("node-b")
    restarted.generation = "gen-node-b-2"
    with serving(restarted) as b2:
        r = http.post(b2.internal + path, content=b"{}", headers=headers)
        assert r.status_code == 401
        assert r.json()["error"] == "stale_target"
        assert r.json()["outcome"] == "not_run"
    assert restarted.calls == []
    assert first.counters == {"a": 1}


def test_route_to_a_restarted_owner_is_refreshed(
    pair: tuple[Served, Served], http: httpx.Client
) -> None:
    a, b = pair
    a.node.routes = [RemoteOwner("node-b", b.internal, "gen-before-restart"), owner_route(b)]
    r = post(http, a.public, "/cells/Counter/r/whoami", {})
    assert r.status_code == 200
    assert r.json() == {"result": "node-b"}
    assert a.node.forgotten == [("Counter", "r")]
    assert len(b.node.calls) == 1  # the stale forward never reached the node


def test_another_fleet_key_is_still_peer_refused_without_reroute(http: httpx.Client) -> None:
    with serving(FakeNode("node-a")) as a, serving(FakeNode("node-b"), key=bytes(32)) as b:
        a.node.routes = [owner_route(b)] * 2
        r = post(http, a.public, "/cells/Counter/c/whoami", {})
        assert r.status_code == 502
        assert r.json()["error"] == "peer_refused"
        assert r.json()["outcome"] == "not_run"
        assert a.node.forgotten == []


# --- the client: one key per logical call, reused across its retries ----------------------------


def test_client_retries_a_lost_answer_and_the_cell_runs_once(served: Served) -> None:
    served.node.lost_answers = 1  # committed, then answered not_durable
    with Client([served.public], backoff=0.01) as client:
        assert client.cell("Counter", "a").applied_then_lost(by=2) == 2
    assert served.node.counters == {"a": 2}  # applied once
    assert len(served.node.calls) == 2
    assert served.node.keys[0] == served.node.keys[1] is not None


def test_client_retries_a_dropped_connection_under_the_same_key(
    served: Served, dropper: RawServer
) -> None:
    with Client([dropper.url, served.public], backoff=0.01) as client:
        assert client.cell("Counter", "a").increment(by=4) == 4
    [(line, headers, body)] = dropper.requests
    assert line.startswith(b"POST /cells/Counter/a/increment")
    assert body == b'{"by":4}'
    assert served.node.keys == [headers["idempotency-key"]]


def test_client_without_keys_does_not_retry_a_dropped_connection(
    served: Served, dropper: RawServer
) -> None:
    with (
        Client([dropper.url, served.public], idempotency_keys=False) as client,
        pytest.raises(NotDurable, match="may have run") as info,
    ):
        client.cell("Counter", "a").increment()
    assert isinstance(info.value.__cause__, httpx.RemoteProtocolError)
    [(_, headers, _)] = dropper.requests
    assert "idempotency-key" not in headers
    assert served.node.calls == []


def test_an_explicit_key_is_retried_even_without_automatic_keys(
    served: Served, dropper: RawServer
) -> None:
    with Client([dropper.url, served.public], idempotency_keys=False, backoff=0.01) as client:
        assert client.cell("Counter", "a").with_key("mine-1").increment() == 1
    assert served.node.keys == ["mine-1"]


def test_unknown_then_not_run_is_raised_as_not_durable(served: Served) -> None:
    served.node.flaky_failures = 10
    dead = f"http://127.0.0.1:{free_port()}"
    with (
        Client([served.public, dead], max_attempts=2, backoff=0.01) as client,
        pytest.raises(NotDurable, match="earlier attempt may have run") as info,
    ):
        client.cell("Counter", "a").flaky()
    assert isinstance(info.value.__cause__, NodeUnavailable)
    assert len(served.node.calls) == 1


def test_with_key_and_invoke(served: Served) -> None:
    with Client(served.public) as client:
        keyed = client.cell("Counter", "a").with_key("k1")
        assert keyed.increment(by=1) == 1
        assert keyed.increment(by=1) == 1  # the same logical call again: not run twice
        assert client.invoke("Counter", "a", "increment", {"by": 1}, key="k1") == 1
        with pytest.raises(KeyConflict):
            client.invoke("Counter", "a", "increment", {"by": 9}, key="k1")
        assert client.invoke("Counter", "a", "increment", {"by": 1}) == 2
    assert served.node.counters == {"a": 2}
    assert served.node.keys[:4] == ["k1"] * 4  # the conflict was not retried
    assert served.node.keys[4] not in (None, "k1")


def test_a_method_parameter_named_key_is_an_ordinary_argument(served: Served) -> None:
    with Client(served.public) as client:
        assert client.cell("Counter", "a").echo(key="mine") == {"key": "mine"}
        assert client.call("Counter", "a", "echo", key="x") == {"key": "x"}
    assert "mine" not in served.node.keys
    assert "x" not in served.node.keys


def test_bad_result_is_raised_and_not_retried(served: Served) -> None:
    with Client(served.public) as client, pytest.raises(BadResult) as info:
        client.cell("Counter", "a").nan()
    assert info.value.outcome == "failed"
    assert len(served.node.calls) == 1


def test_client_refuses_bad_keys_and_unencodable_arguments(served: Served) -> None:
    from cellactors.errors import BadRequest

    with Client(served.public) as client:
        with pytest.raises(ValueError, match="idempotency key"):
            client.cell("Counter", "a").with_key("no spaces")
        with pytest.raises(ValueError, match="idempotency key"):
            client.invoke("Counter", "a", "increment", {}, key="")
        with pytest.raises(BadRequest, match="cannot be encoded"):
            client.cell("Counter", "a").echo(x=float("nan"))
    assert served.node.calls == []
