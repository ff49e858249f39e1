"""The internal listener answers only to its own names in ``Host`` (cellactors.server.hosts):
a page whose name was rebound to the node's address (DNS rebinding) reads nothing."""

from __future__ import annotations

from types import SimpleNamespace

import httpx
import pytest

from cellactors.server import hosts
from cellactors.server.app import ServerSettings
from tests.helpers.fake_node import FakeNode, serving


@pytest.mark.parametrize(
    ("value", "name"),
    [("Node-A:8081", "node-a"), ("[::1]:8081", "::1"), ("::1", "::1"), ("10.0.0.7", "10.0.0.7")],
)
def test_host_names(value: str, name: str) -> None:
    assert hosts.host_name(value) == name


def test_own_names_leave_out_a_wildcard_bind_and_keep_patterns() -> None:
    names = hosts.own_names("0.0.0.0", ["10.0.0.7:8081", "*.peers.ns.svc"])
    assert "0.0.0.0" not in names and "10.0.0.7" in names
    assert hosts.answers_to(names, "cellactors-0.peers.ns.svc:8081")
    assert not hosts.answers_to(names, "cellactors-0.peers.ns.svc.evil.example:8081")
    assert not hosts.answers_to(names, "evil.example")
    assert hosts.answers_to(hosts.own_names("10.1.2.3", []), "10.1.2.3:8081")


def test_the_internal_listener_refuses_a_host_not_its_own() -> None:
    node = FakeNode()
    settings = ServerSettings(internal_hosts=("node-a.internal",))
    with serving(node, settings=settings) as served, httpx.Client() as http:
        url = served.internal + "/state"
        assert http.get(url).status_code == 200  # 127.0.0.1
        assert http.get(url, headers={"host": "localhost:1"}).status_code == 200
        assert http.get(url, headers={"host": "node-a.internal:8081"}).status_code == 200
        rebound = http.get(url, headers={"host": "evil.example:8081"})
        assert rebound.status_code == 421
        assert (rebound.json()["error"], rebound.json()["outcome"]) == ("unknown_host", "not_run")
        page = http.get(served.internal + "/", headers={"host": "evil.example"})
        assert page.status_code == 421  # the fleet page too
        # The public listener takes calls from any name (a load balancer's, a client's).
        public = http.get(served.public + "/healthz", headers={"host": "api.example"})
        assert public.status_code == 200


def test_the_address_a_node_advertises_is_one_of_its_names() -> None:
    """Peers dial the address in the node's lease: a node listening on every interface
    (0.0.0.0) answers to it without being told, whoever serves it (the command or the
    Python API)."""
    node = FakeNode()
    node.settings = SimpleNamespace(advertise="node-a.example:8081")  # type: ignore[attr-defined]
    with serving(node) as served, httpx.Client() as http:
        url = served.internal + "/state"
        assert http.get(url, headers={"host": "node-a.example:8081"}).status_code == 200
        assert http.get(url, headers={"host": "node-b.example:8081"}).status_code == 421
