"""A node calling a peer's cell (the outbox, calls between cells) tells a request that never
reached the owner whole (``not_run``) from one cut off after it was written (``unknown``),
as the client does (tests/test_client_retries.py), against raw sockets on loopback that
reset the connection at a chosen point (cellactors.wire.unsent)."""

from __future__ import annotations

import pytest

from cellactors.errors import NodeUnavailable, NotDurable, RemoteOwner
from cellactors.server.peer_calls import PeerCaller
from tests.helpers.fake_node import KEY
from tests.helpers.raw_server import BIG, RawServer


def owner_at(server: RawServer) -> RemoteOwner:
    return RemoteOwner("node-x", server.url, "gen-x")


@pytest.mark.parametrize(
    ("mode", "size", "error"),
    [("reset_after_head", BIG, NodeUnavailable), ("reset_after_request", "x", NotDurable)],
)
def test_a_peer_call_tells_unsent_from_cut_off(
    mode: str, size: str, error: type[Exception]
) -> None:
    server = RawServer(mode=mode)  # type: ignore[arg-type]
    try:
        with pytest.raises(error):
            PeerCaller("node-a", KEY)(
                owner_at(server), "Counter", "c", "echo", {"x": size}, "k-1", ()
            )
    finally:
        server.close()
