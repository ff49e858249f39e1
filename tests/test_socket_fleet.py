"""Sockets into cells across real ``cellactors serve`` processes on one SeaweedFS bucket:
two clients on two nodes talking through a cell owned by a third; the owner SIGKILLed
mid-conversation (the sockets stay open, nothing acknowledged is lost or doubled); the
node holding a socket drained (the client resumes on another); a hibernated cell with
sockets open (no bucket request for the cell while idle, woken by the next message).

Every wait polls with a deadline.
"""

from __future__ import annotations

import json
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from cellactors.client import Client
from cellactors.persistence.store.embedded import SeaweedServer
from cellactors.socket_client import CellSocket
from tests.helpers.fleet import Fleet, NodeProc, wait_for
from tests.helpers.stores import make_s3_bucket

pytestmark = pytest.mark.fleet

APP = """
from cellactors import CellActor, read_only


class Room(CellActor):
    def on_activate(self):
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS lines (seq INTEGER PRIMARY KEY, text TEXT UNIQUE)"
        )

    def on_connect(self, conn):
        conn.attachment = {"said": 0}
        conn.send("welcome")

    def on_message(self, conn, data):
        self.db.execute("INSERT INTO lines (text) VALUES (?)", [data])
        conn.attachment = {"said": conn.attachment["said"] + 1}
        self.broadcast(data)

    @read_only
    def lines(self):
        return [r[0] for r in self.db.execute("SELECT text FROM lines ORDER BY seq")]

    def say(self, text):
        self.db.execute("INSERT INTO lines (text) VALUES (?)", [text])
        return self.broadcast(text)
"""

MakeFleet = Callable[..., Fleet]


@pytest.fixture
def make_fleet(tmp_path: Path, seaweed: SeaweedServer) -> Iterator[MakeFleet]:
    fleets: list[Fleet] = []

    def make(size: int, extra: list[str] | None = None, lease_ttl: float = 2.0) -> Fleet:
        bucket = make_s3_bucket(seaweed.endpoint)
        root = tmp_path / f"f{len(fleets)}"
        root.mkdir()
        app = root / "rooms.py"
        app.write_text(APP)
        nodes = [
            NodeProc(
                f"w{i}",
                app,
                root / f"n{i}",
                f"s3://{bucket.bucket}",
                seaweed.endpoint,
                lease_ttl=lease_ttl,
                extra=list(extra or []),
            )
            for i in range(size)
        ]
        fleet = Fleet(nodes)
        fleets.append(fleet)
        fleet.start()
        return fleet

    yield make
    for fleet in fleets:
        fleet.stop()


def recv_until(sock: CellSocket, want: Callable[[list[str]], bool], timeout: float) -> list[str]:
    """Frames received until ``want`` holds of all received so far (or fail at the deadline)."""
    got: list[str] = []
    deadline = time.monotonic() + timeout
    while not want(got):
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"gave up waiting; received {got}")
        try:
            got.append(str(sock.recv(timeout=left)))
        except TimeoutError:
            continue
    return got


def own_cell(fleet: Fleet, node: NodeProc, name: str) -> None:
    """Make ``node`` the owner of ``Room:name`` (its first call lands there)."""
    httpx.post(f"{node.public_url}/cells/Room/{name}/say", json={"text": "first"}, timeout=30)
    owner, _ = fleet.owner(f"Room:{name}")
    assert owner is node


def test_two_clients_on_two_nodes_talk_through_a_third(make_fleet: MakeFleet) -> None:
    fleet = make_fleet(3)
    own_cell(fleet, fleet[2], "r1")
    with (
        CellSocket([fleet[0].public_url], "Room", "r1") as a,
        CellSocket([fleet[1].public_url], "Room", "r1") as b,
    ):
        assert a.recv(timeout=10) == "welcome"
        assert b.recv(timeout=10) == "welcome"
        a.send("from a")
        b.send("from b")
        seen_a = recv_until(a, lambda got: len(got) == 2, 15)
        seen_b = recv_until(b, lambda got: len(got) == 2, 15)
        assert seen_a == seen_b  # one order, the cell's
        assert sorted(seen_a) == ["from a", "from b"]
        # An HTTP call's broadcast reaches both sockets too, after its answer is durable.
        assert httpx.post(
            f"{fleet[0].public_url}/cells/Room/r1/say", json={"text": "by http"}, timeout=30
        ).json() == {"result": 2}
        assert recv_until(a, lambda got: "by http" in got, 10)[-1] == "by http"
        assert recv_until(b, lambda got: "by http" in got, 10)[-1] == "by http"


def test_the_owner_killed_mid_conversation(make_fleet: MakeFleet) -> None:
    """The owner is SIGKILLed while a client sends: both sockets (held by the surviving
    nodes) stay open, the conversation resumes through the new owner, and every line a
    client saw is durable, seen once, in the cell's order."""
    fleet = make_fleet(3)
    own_cell(fleet, fleet[2], "r2")
    a = CellSocket([fleet[0].public_url], "Room", "r2")
    b = CellSocket([fleet[1].public_url], "Room", "r2")
    try:
        assert a.recv(timeout=10) == "welcome" and b.recv(timeout=10) == "welcome"
        seen_b: list[str] = []
        stop = threading.Event()

        def read_b() -> None:
            while not stop.is_set():
                try:
                    seen_b.append(str(b.recv(timeout=0.5)))
                except TimeoutError:
                    continue

        reader = threading.Thread(target=read_b, daemon=True)
        reader.start()
        seen_a: list[str] = []
        killed_at = 0.0
        for i in range(40):
            a.send(f"line {i}")
            line = f"line {i}"
            seen_a += recv_until(a, lambda got: line in got, 30)  # noqa: B023
            if i == 15:
                fleet[2].signal(signal.SIGKILL)
                killed_at = time.monotonic()
            if i == 16:
                # Through the new owner within the lease TTL and a little more.
                assert time.monotonic() - killed_at < 2.0 + 8.0
        wait_for("b saw every line", lambda: len(seen_b) >= 40 or None, 20)
        stop.set()
        reader.join(5)
        assert a.resumes == 0 and b.resumes == 0  # their holders never went away
        expected = [f"line {i}" for i in range(40)]
        assert seen_a == expected
        assert seen_b == expected
        lines = httpx.post(
            f"{fleet[0].public_url}/cells/Room/r2/lines", json={}, timeout=30
        ).json()["result"]
        assert lines == ["first", *expected]  # durable, once each
    finally:
        a.close()
        b.close()


def test_the_holder_drained_the_client_resumes_elsewhere(make_fleet: MakeFleet) -> None:
    fleet = make_fleet(2, lease_ttl=5.0)
    own_cell(fleet, fleet[1], "r3")
    urls = [fleet[0].public_url, fleet[1].public_url]
    with CellSocket(urls, "Room", "r3") as a, CellSocket([urls[1]], "Room", "r3") as b:
        assert a.recv(timeout=10) == "welcome" and b.recv(timeout=10) == "welcome"
        a.send("before")
        assert recv_until(a, lambda got: "before" in got, 15) == ["before"]
        assert recv_until(b, lambda got: "before" in got, 15) == ["before"]
        fleet[0].signal(signal.SIGTERM)  # a's holder drains
        assert fleet[0].wait(60) == 0
        # Said while a was between nodes: it gets it once, on its new holder.
        httpx.post(f"{urls[1]}/cells/Room/r3/say", json={"text": "during"}, timeout=30)
        assert recv_until(a, lambda got: "during" in got, 20) == ["during"]
        a.send("after")
        assert recv_until(b, lambda got: "after" in got, 20) == ["during", "after"]
        assert recv_until(a, lambda got: "after" in got, 20) == ["after"]
        assert a.resumes >= 1


def bucket_requests(node: NodeProc) -> dict[str, float]:
    """The node's bucket requests by key kind (its metrics)."""
    text = httpx.get(f"{node.internal_url}/metrics", timeout=10).text
    out: dict[str, float] = {}
    for m in re.finditer(r"^cellactors_bucket_requests_total\{([^}]*)\} (\S+)$", text, re.M):
        kind = re.search(r'kind="([^"]*)"', m.group(1))
        assert kind is not None
        out[kind.group(1)] = out.get(kind.group(1), 0.0) + float(m.group(2))
    return out


def test_a_hibernated_cell_keeps_its_sockets(make_fleet: MakeFleet) -> None:
    """Idle with sockets open, the cell hibernates and costs no bucket request; the next
    message wakes it and is answered on the socket."""
    fleet = make_fleet(2, extra=["--idle-timeout", "60", "--hibernate-after", "1"])
    own_cell(fleet, fleet[1], "r4")
    with CellSocket([fleet[0].public_url], "Room", "r4") as a:
        assert a.recv(timeout=10) == "welcome"
        a.send("one")
        assert recv_until(a, lambda got: "one" in got, 15) == ["one"]

        def hibernated() -> bool | None:
            state = httpx.get(f"{fleet[1].internal_url}/state", timeout=10).json()
            return state.get("hibernated_cells", 0) >= 1 or None

        wait_for("the room hibernated", hibernated, 20)
        cell_kinds = ("own", "batch", "seal", "snapshot")
        before = [bucket_requests(n) for n in fleet]
        time.sleep(3)  # the window measured: nothing of the cell may happen in it
        after = [bucket_requests(n) for n in fleet]
        for b, c in zip(before, after, strict=True):
            assert {k: c.get(k, 0) - b.get(k, 0) for k in cell_kinds} == dict.fromkeys(
                cell_kinds, 0
            )
        a.send("two")
        assert recv_until(a, lambda got: "two" in got, 15) == ["two"]


def test_refusals_and_bad_frames(make_fleet: MakeFleet) -> None:
    fleet = make_fleet(1)
    url = fleet[0].public_url
    from websockets.exceptions import ConnectionClosed, InvalidStatus
    from websockets.sync.client import connect
    from websockets.typing import Origin

    ws_url = "ws" + url[len("http") :]
    # A class that takes no sockets, and a bad cell name: refused at the handshake.
    for path in ("/cells/Nope/x/ws", "/cells/Room/" + "x" * 600 + "/ws"):
        with pytest.raises(InvalidStatus) as refused:
            connect(ws_url + path)
        assert refused.value.response.status_code in (400, 404)
        assert json.loads(refused.value.response.body or b"{}")["outcome"] == "not_run"
    # A page of another origin.
    with pytest.raises(InvalidStatus) as foreign:
        connect(ws_url + "/cells/Room/r5/ws", origin=Origin("http://evil.example"))
    assert foreign.value.response.status_code == 403
    # A resume of a socket the cell never had.
    with connect(ws_url + "/cells/Room/r5/ws?resume=" + "A" * 22 + "&after=0") as ws:
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=10)
        assert ws.close_code == 4404
    # A frame over the node's limit closes the socket with 1009, and the cell runs nothing.
    with Client(url) as client, connect(ws_url + "/cells/Room/r5/ws") as ws:
        assert ws.recv(timeout=10) == "welcome"
        ws.send("x" * ((1 << 20) + 1))
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=10)
        assert ws.close_code == 1009
        assert client.call("Room", "r5", "lines") == []


def test_the_owner_paused_past_its_ttl(make_fleet: MakeFleet) -> None:
    """SIGSTOP of the owner mid-conversation: the next message is answered through the new
    owner within the TTL and a few seconds (a forward to a paused owner waits no longer
    than that), once; the paused owner, resumed, fences itself."""
    fleet = make_fleet(3)
    own_cell(fleet, fleet[2], "r6")
    with CellSocket([fleet[0].public_url], "Room", "r6") as a:
        assert a.recv(timeout=10) == "welcome"
        a.send("before")
        assert recv_until(a, lambda got: "before" in got, 15) == ["before"]
        fleet[2].signal(signal.SIGSTOP)
        try:
            paused_at = time.monotonic()
            a.send("while paused")
            assert recv_until(a, lambda got: "while paused" in got, 30) == ["while paused"]
            assert time.monotonic() - paused_at < 2.0 + 6.0
        finally:
            fleet[2].signal(signal.SIGCONT)
        a.send("after")
        assert recv_until(a, lambda got: "after" in got, 15) == ["after"]
    lines = httpx.post(f"{fleet[0].public_url}/cells/Room/r6/lines", json={}, timeout=30)
    assert lines.json()["result"] == ["first", "before", "while paused", "after"]


def test_a_served_process_authenticates_sockets(make_fleet: MakeFleet, tmp_path: Path) -> None:
    """One ``serve`` process with API keys: an anonymous socket is refused (401); a token
    sent as a subprotocol is admitted, and its sockets hear each other and the calls."""
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"ak_ann_0123456789abcdef01": {"principal": "ann"}}))
    fleet = make_fleet(1, extra=["--api-keys", str(keys)])
    url = fleet[0].public_url
    with pytest.raises(InvalidStatus) as anonymous:
        connect("ws" + url[len("http") :] + "/cells/Room/t/ws")
    assert anonymous.value.response.status_code == 401
    token = "ak_ann_0123456789abcdef01"
    with (
        CellSocket([url], "Room", "t", token=token, tags=["red"]) as red,
        CellSocket([url], "Room", "t", token=token, tags=["blue"]) as blue,
    ):
        assert red.recv(timeout=10) == "welcome" and blue.recv(timeout=10) == "welcome"
        red.send("to all")
        assert recv_until(blue, lambda got: "to all" in got, 15) == ["to all"]
        client = Client(url, token=token)
        assert client.call("Room", "t", "say", text="hi") == 2
        assert recv_until(blue, lambda got: "hi" in got, 15) == ["hi"]
        assert recv_until(red, lambda got: "hi" in got, 15) == ["to all", "hi"]
        client.close()


def test_the_owner_drained_mid_conversation(make_fleet: MakeFleet) -> None:
    """SIGTERM of the owner while sockets on the other nodes talk: it releases the cell, the
    sockets stay open, the next owner answers at once (no TTL to wait for), nothing lost
    or doubled."""
    fleet = make_fleet(3, lease_ttl=30.0)
    own_cell(fleet, fleet[2], "r7")
    with (
        CellSocket([fleet[0].public_url], "Room", "r7") as a,
        CellSocket([fleet[1].public_url], "Room", "r7") as b,
    ):
        assert a.recv(timeout=10) == "welcome" and b.recv(timeout=10) == "welcome"
        a.send("before")
        assert recv_until(b, lambda got: "before" in got, 15) == ["before"]
        fleet[2].signal(signal.SIGTERM)
        assert fleet[2].wait(60) == 0
        started = time.monotonic()
        a.send("after")
        assert recv_until(a, lambda got: "after" in got, 15) == ["before", "after"]
        assert recv_until(b, lambda got: "after" in got, 15) == ["after"]
        assert time.monotonic() - started < 15  # far below the 30 s TTL
        assert a.resumes == 0 and b.resumes == 0
    lines = httpx.post(f"{fleet[0].public_url}/cells/Room/r7/lines", json={}, timeout=30)
    assert lines.json()["result"] == ["first", "before", "after"]
