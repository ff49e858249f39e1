"""The one signed forward (cellactors.server.forward): the owner's refusals of a signature
mean the same on both paths that forward. For a call between cells (PeerCaller) against a
raw loopback peer: a stale target is a stale route and any other refusal ``peer_refused``,
both ``not_run`` (before, the second came back as the peer's own ``unauthorized``); an
address that is no URL never left (``node_unavailable``)."""

from __future__ import annotations

import json

import pytest

from cellactors.core.routing import reroutable_error
from cellactors.errors import CallError, NodeUnavailable, PeerRefused, RemoteOwner, StaleRoute
from cellactors.server import forward
from cellactors.server.peer_calls import PeerCaller
from tests.helpers.fake_node import KEY
from tests.helpers.raw_server import RawServer


def answer(status: int, body: dict[str, object]) -> bytes:
    data = json.dumps(body).encode()
    return (
        f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\n"
        f"content-length: {len(data)}\r\nconnection: close\r\n\r\n"
    ).encode() + data


@pytest.mark.parametrize(
    ("code", "error", "reroute"),
    [("stale_target", StaleRoute, True), ("unauthorized", PeerRefused, False)],
)
def test_a_refused_signature_means_the_same_between_cells(
    code: str, error: type[CallError], reroute: bool
) -> None:
    server = RawServer(answer(401, {"error": code, "message": "no", "outcome": "not_run"}))
    try:
        with pytest.raises(error) as info:
            PeerCaller("node-a", KEY)(
                RemoteOwner("node-x", server.url, "gen-x"), "Counter", "c", "get", {}, None, ()
            )
    finally:
        server.close()
    assert info.value.outcome == "not_run"
    assert reroutable_error(info.value) is reroute
    assert server.heads == 1


def test_a_forward_carries_its_signature_chain_and_key() -> None:
    owner = RemoteOwner("node-x", "127.0.0.1:9", "gen-x")
    sent = forward.signed(
        KEY,
        "node-a",
        owner,
        "Counter",
        "a b",
        "get",
        b"{}",
        "json",
        idempotency_key="k-1",
        now=1_000.0,
        chain=("Hop:x", "Hop:y"),
    )
    assert sent.url == "http://127.0.0.1:9/internal/cells/Counter/a%20b/get"
    assert sent.headers[forward.CHAIN_HEADER] == "Hop:x,Hop:y"
    assert forward.decode_chain(sent.headers[forward.CHAIN_HEADER]) == ("Hop:x", "Hop:y")
    assert sent.headers["Content-Type"] == "application/json"


def test_an_address_that_is_no_url_never_left() -> None:
    with pytest.raises(NodeUnavailable):
        PeerCaller("node-a", KEY)(
            RemoteOwner("node-x", "http://[::1", "gen-x"), "Counter", "c", "get", {}, None, ()
        )
