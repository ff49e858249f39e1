"""Three ``cellactors serve`` processes on one real SeaweedFS bucket: routing to the one
owner, acknowledged writes surviving SIGKILL, SIGSTOP and rolling restarts, self-fence exit,
peer authentication on the internal listener, and drain under load.

Every wait polls with a deadline. Lease TTLs are short (2 s) except in the drain test, whose
30 s TTL makes any wait for lease expiry show up as a failure.
"""

from __future__ import annotations

import functools
import json
import signal
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cellactors.persistence.store.embedded import SeaweedServer
from cellactors.persistence.store.s3 import S3Bucket
from cellactors.server import signing
from tests.helpers.fleet import (
    NODE_HEADER,
    Fleet,
    NodeProc,
    Writer,
    ledger_entries,
    wait_for,
    write_app,
)
from tests.helpers.stores import make_s3_bucket

pytestmark = pytest.mark.fleet

MakeFleet = Callable[..., tuple[Fleet, S3Bucket]]


def _new_fleet(
    root: Path, seaweed: SeaweedServer, size: int, lease_ttl: float, tag: str
) -> tuple[Fleet, S3Bucket]:
    bucket = make_s3_bucket(seaweed.endpoint)
    app = write_app(root)
    nodes = [
        NodeProc(
            f"{tag}-{i}",
            app,
            root / f"n{i}",
            f"s3://{bucket.bucket}",
            seaweed.endpoint,
            lease_ttl=lease_ttl,
        )
        for i in range(size)
    ]
    return Fleet(nodes), bucket


@pytest.fixture
def make_fleet(tmp_path: Path, seaweed: SeaweedServer) -> Iterator[MakeFleet]:
    """Start fleets on fresh buckets; every process is killed at teardown."""
    fleets: list[Fleet] = []

    def make(size: int = 3, lease_ttl: float = 2.0, tag: str = "n") -> tuple[Fleet, S3Bucket]:
        fleet, bucket = _new_fleet(tmp_path / f"f{len(fleets)}", seaweed, size, lease_ttl, tag)
        fleets.append(fleet)
        fleet.start()
        return fleet, bucket

    yield make
    for fleet in fleets:
        fleet.stop()


@pytest.fixture(scope="module")
def shared_fleet(
    tmp_path_factory: pytest.TempPathFactory, seaweed: SeaweedServer
) -> Iterator[tuple[Fleet, S3Bucket]]:
    """One healthy fleet for the tests that do not break nodes."""
    fleet, bucket = _new_fleet(tmp_path_factory.mktemp("shared"), seaweed, 3, 2.0, "s")
    try:
        fleet.start()
        yield fleet, bucket
    finally:
        fleet.stop()


def append(url: str, cell: str, entry: str, timeout: float = 10.0) -> httpx.Response:
    return httpx.post(f"{url}/cells/Ledger/{cell}/append", json={"entry": entry}, timeout=timeout)


def read_json(bucket: S3Bucket, key: str) -> dict[str, Any]:
    stored = bucket.get(key)
    assert stored is not None, f"{key} is missing"
    value: dict[str, Any] = json.loads(stored.body)
    return value


def send_raw(url: str, cell: str, entry: str) -> socket.socket:
    """Send one complete call on a fresh connection without waiting for the answer."""
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps({"entry": entry}).encode()
    head = (
        f"POST /cells/Ledger/{cell}/append HTTP/1.1\r\nHost: {host}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    sock = socket.create_connection((host, int(port)), timeout=5)
    sock.sendall(head + body)
    return sock


def read_status(sock: socket.socket, timeout: float = 20.0) -> int | None:
    """The HTTP status of the answer on ``sock`` (None when closed without one)."""
    sock.settimeout(timeout)
    data = b""
    with sock:
        try:
            while b"\r\n" not in data:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                data += chunk
        except OSError:
            return None
    line = data.split(b"\r\n", 1)[0].split()
    return int(line[1]) if len(line) >= 2 and line[1].isdigit() else None


def assert_all_acked_present(writers: list[Writer], urls: list[str]) -> None:
    for w in writers:
        acked = [a.entry for a in w.acked()]
        assert acked, f"writer {w.tag} got no acknowledgement at all: {w.failures[-5:]}"
        entries = ledger_entries(urls, w.cell)
        missing = sorted(set(acked) - set(entries), key=lambda e: int(e.rsplit("-", 1)[1]))
        assert not missing, f"acknowledged but lost on Ledger:{w.cell}: {missing}"
        assert len(entries) == len(set(entries))


# --------------------------------------------------------------------------- routing


def test_calls_through_every_node_reach_the_one_owner(shared_fleet: tuple[Fleet, S3Bucket]) -> None:
    fleet, _ = shared_fleet
    for c in range(3):
        cell = f"route{c}"
        executed_by = set()
        for round_ in range(2):
            for node in fleet:
                resp = append(node.public_url, cell, f"{node.node_id}-{round_}")
                assert resp.status_code == 200, resp.text
                executed_by.add(resp.headers[NODE_HEADER])
        assert len(executed_by) == 1, f"Ledger:{cell} executed on {executed_by}"
        owner, entry = fleet.owner(f"Ledger:{cell}")
        assert {owner.node_id} == executed_by
        assert entry["epoch"] >= 1
        assert len(ledger_entries(fleet.urls, cell)) == 6
    # placement: an unowned cell lands on the node that took the call
    for node in fleet:
        resp = append(node.public_url, f"placed-{node.node_id}", "x")
        assert resp.headers[NODE_HEADER] == node.node_id


def test_internal_listener_refuses_bad_signatures(shared_fleet: tuple[Fleet, S3Bucket]) -> None:
    fleet, bucket = shared_fleet
    stored = bucket.get("fleet/peer-auth.json")
    assert stored is not None
    key = bytes.fromhex(json.loads(stored.body)["key"])
    target, source = fleet[0], fleet[1]
    path = "/internal/cells/Ledger/peerauth/append"
    generation = httpx.get(target.internal_url + "/healthz", timeout=5).json()["generation"]

    def body(entry: str) -> bytes:
        return json.dumps({"entry": entry}).encode()

    def signed(b: bytes, **kw: object) -> dict[str, str]:
        args: dict[str, object] = {
            "source": source.node_id,
            "target": target.node_id,
            "target_generation": generation,
            **kw,
        }
        use_key = args.pop("key", key)
        assert isinstance(use_key, bytes)
        headers = signing.sign_request(use_key, "POST", path, b, **args)  # type: ignore[arg-type]
        return {**headers, "Content-Type": "application/json"}

    def post(url: str, b: bytes, headers: dict[str, str]) -> httpx.Response:
        return httpx.post(url + path, content=b, headers=headers, timeout=10)

    url = target.internal_url
    refused = {
        "unsigned": post(url, body("u"), {"Content-Type": "application/json"}),
        "wrong key": post(url, body("w"), signed(body("w"), key=b"\x01" * 32)),
        "stale": post(url, body("s"), signed(body("s"), now=time.time() - 120)),
        "future": post(url, body("f"), signed(body("f"), now=time.time() + 120)),
        "other target": post(url, body("t"), signed(body("t"), target=fleet[2].node_id)),
        "other generation": post(url, body("g"), signed(body("g"), target_generation="0" * 16)),
        "tampered body": post(url, body("tampered"), signed(body("original"))),
    }
    for what, resp in refused.items():
        assert resp.status_code == 401, f"{what}: {resp.status_code} {resp.text}"

    good = signed(body("good"))
    first = post(url, body("good"), good)
    assert first.status_code == 200, first.text
    replay = post(url, body("good"), good)
    assert replay.status_code == 401, "a replayed nonce was accepted"

    # The public listener has no internal route at all, signed or not.
    public = target.public_url
    assert post(public, body("p"), signed(body("p"))).status_code == 404
    for route in ("/state", "/metrics"):
        assert httpx.get(public + route, timeout=5).status_code == 404
    assert httpx.get(url + "/state", timeout=5).status_code == 200

    assert ledger_entries(fleet.urls, "peerauth") == ["good"]


# --------------------------------------------------------------------------- failures


def test_sigkill_of_owner_loses_no_acknowledged_write(make_fleet: MakeFleet) -> None:
    fleet, _ = make_fleet(tag="k")
    cell = "kill"
    victim = fleet[0]
    assert append(victim.public_url, cell, "warm").status_code == 200
    _, before = fleet.owner(f"Ledger:{cell}")
    writer = Writer(lambda: fleet.urls, cell, "k").start()
    try:
        wait_for("20 acks", lambda: len(writer.acked()) >= 20, 20)
        victim.signal(signal.SIGKILL)
        assert victim.wait(10) == -signal.SIGKILL
        killed_at = time.monotonic()
        wait_for("acks after the takeover", lambda: len(writer.acks_after(killed_at)) >= 5, 30)
    finally:
        writer.stop()
    survivors = [n.public_url for n in fleet if n.running]
    assert_all_acked_present([writer], survivors)
    owner, after = fleet.owner(f"Ledger:{cell}")
    assert owner is not victim
    assert after["epoch"] > before["epoch"]
    assert {a.node for a in writer.acks_after(killed_at)} == {owner.node_id}


def test_paused_owner_fences_itself_and_acknowledges_nothing_after_takeover(
    make_fleet: MakeFleet,
) -> None:
    fleet, _ = make_fleet(tag="p")
    cell = "pause"
    victim = fleet[0]
    assert append(victim.public_url, cell, "warm").status_code == 200
    _, before = fleet.owner(f"Ledger:{cell}")
    others = [n.public_url for n in fleet if n is not victim]
    writer = Writer(lambda: others, cell, "p", timeout=3.0).start()
    try:
        wait_for("10 acks", lambda: len(writer.acked()) >= 10, 20)
        victim.signal(signal.SIGSTOP)
        stopped_at = time.monotonic()
        taken = wait_for(
            "a takeover by another node",
            lambda: [a for a in writer.acks_after(stopped_at) if a.node != victim.node_id],
            30,
        )
        takeover_at = taken[0].at
        # Calls sent while the owner is stopped (the kernel queues them); read after SIGCONT.
        direct = [send_raw(victim.public_url, cell, f"direct-{i}") for i in range(3)]
        victim.signal(signal.SIGCONT)
        assert victim.wait(30) == 3, victim.output()[-3000:]
    finally:
        writer.stop()

    assert any(line.startswith("SELF-FENCE:") for line in victim.output().splitlines())
    late = [a for a in writer.acks_after(takeover_at) if a.node == victim.node_id]
    assert not late, f"the fenced owner acknowledged after the takeover: {late}"
    for sock in direct:
        status = read_status(sock)
        assert status != 200, "the fenced node answered a call with 200"
    survivors = [n.public_url for n in fleet if n.running]
    assert_all_acked_present([writer], survivors)
    _, after = fleet.owner(f"Ledger:{cell}")
    assert after["epoch"] > before["epoch"]
    entries = ledger_entries(survivors, cell)
    assert not any(e.startswith("direct-") for e in entries)


def test_rolling_restart_loses_no_acknowledged_write(make_fleet: MakeFleet) -> None:
    fleet, _ = make_fleet(tag="r")
    writers = []
    for i, node in enumerate(fleet):
        assert append(node.public_url, f"roll{i}", "warm").status_code == 200
        writers.append(Writer(lambda: fleet.urls, f"roll{i}", f"r{i}").start())

    def all_acked_after(moment: float) -> bool:
        return all(w.acks_after(moment) for w in writers)

    try:
        for node in fleet:
            wait_for("progress", lambda: all(len(w.acked()) >= 5 for w in writers), 20)
            node.signal(signal.SIGTERM)
            assert node.wait(30) == 0, node.output()[-3000:]
            node.start().ready(30)
            back_at = time.monotonic()
            wait_for(
                f"every cell answering after {node.node_id} restarted",
                functools.partial(all_acked_after, back_at),
                20,
            )
    finally:
        for w in writers:
            w.stop()
    assert_all_acked_present(writers, fleet.urls)
    for i in range(len(writers)):
        assert len(fleet.owners(f"Ledger:roll{i}")) == 1


def drain_under_load(
    fleet: Fleet, cells: list[str], via: list[NodeProc]
) -> tuple[list[Writer], float]:
    """Put ``cells`` on ``fleet[0]``, load them through ``via``, SIGTERM ``fleet[0]`` and wait
    for exit 0; returns the (still running) writers and when the node had exited."""
    leaving = fleet[0]
    for cell in cells:
        assert append(leaving.public_url, cell, "warm").headers[NODE_HEADER] == leaving.node_id
    urls = [n.public_url for n in via]
    writers = [Writer(lambda: urls, cell, f"d{i}").start() for i, cell in enumerate(cells)]
    wait_for("load on every cell", lambda: all(len(w.acked()) >= 5 for w in writers), 20)
    leaving.signal(signal.SIGTERM)
    assert leaving.wait(30) == 0, leaving.output()[-3000:]
    return writers, time.monotonic()


def test_drain_under_load_moves_cells_without_waiting_for_the_ttl(
    make_fleet: MakeFleet,
) -> None:
    """SIGTERM with calls in flight: exit 0, every acknowledged call kept, every cell
    released and the lease expired at once, so a node takes the cells well inside the TTL."""
    fleet, bucket = make_fleet(size=4, lease_ttl=30.0, tag="d")
    leaving, fresh = fleet[0], fleet[3]
    cells = [f"drain{i}" for i in range(4)]
    started = time.monotonic()
    writers, _ = drain_under_load(fleet, cells, via=[fleet[1], fleet[2]])
    for w in writers:
        w.stop()
    lease = read_json(bucket, f"nodes/{leaving.node_id}.json")
    assert lease["expires_ms"] == 0
    for cell in cells:
        own = read_json(bucket, f"cells/Ledger:{cell}/own.json")
        assert own["node"] != leaving.node_id, f"Ledger:{cell} not released: {own}"
    # The released cells are taken at once (no lease to wait for), by whichever node asks.
    for cell in cells:
        resp = append(fresh.public_url, cell, "after-drain")
        assert resp.status_code == 200, resp.text
        assert resp.headers[NODE_HEADER] != leaving.node_id
    assert time.monotonic() - started < 20, "cells waited for the 30 s lease TTL"
    assert_all_acked_present(writers, [fresh.public_url])
    for cell in cells:
        owner, state = fleet.owner(f"Ledger:{cell}")
        assert owner is not leaving and state["epoch"] >= 2


def test_drain_peers_that_routed_to_the_drained_node_follow_at_once(
    make_fleet: MakeFleet,
) -> None:
    fleet, _ = make_fleet(lease_ttl=30.0, tag="c")
    cells = [f"follow{i}" for i in range(2)]
    writers, gone_at = drain_under_load(fleet, cells, via=[fleet[1], fleet[2]])
    try:
        wait_for(
            "every cell answering through the peers that had routed to the drained node",
            lambda: all(w.acks_after(gone_at) for w in writers),
            8,  # well inside the 30 s TTL
        )
    finally:
        for w in writers:
            w.stop()
    assert_all_acked_present(writers, [fleet[1].public_url, fleet[2].public_url])
