"""Sockets into cells on a node served in process (real listeners on loopback, a SeaweedFS
bucket): tags, attachments and ``connections()``; a message whose transaction failed sends
nothing; a client that stops reading is cut off (4408) without holding the cell; event
streams (``/events``); authentication and a socket opened by someone else."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect
from websockets.typing import Subprotocol

from cellactors import CellActor, read_only
from cellactors.actors.sockets import Connection
from cellactors.persistence.store.s3 import S3Bucket
from cellactors.server.app import ServerSettings
from cellactors.socket_client import CellSocket, SocketClosed
from tests.helpers.runtime import eventually
from tests.helpers.served import ServedNode, served_node
from tests.helpers.sockets import keyed_settings, raw_request


class Lobby(CellActor):
    """Sockets tagged by team; a message ``team:<x>`` moves its socket to team x."""

    def on_activate(self) -> None:
        self.db.execute("CREATE TABLE IF NOT EXISTS said (text TEXT)")

    def on_connect(self, conn: Connection) -> None:
        conn.attachment = {"n": 0}

    def on_message(self, conn: Connection, data: str | bytes) -> None:
        text = data if isinstance(data, str) else data.decode()
        conn.attachment = {"n": conn.attachment["n"] + 1}
        if text.startswith("team:"):
            conn.set_tags(text[5:])
            return
        if text == "boom":
            conn.send("never seen")
            self.db.execute("INSERT INTO said VALUES ('boom')")
            raise ValueError("boom")
        if isinstance(data, bytes):
            conn.send(data[::-1])
            return
        self.db.execute("INSERT INTO said VALUES (?)", [text])
        self.broadcast(text, tag=conn.tags[0] if conn.tags else None)

    @read_only
    def roster(self) -> list[dict[str, Any]]:
        return [
            {"tags": list(c.tags), "attachment": c.attachment, "kind": c.kind}
            for c in self.connections()
        ]

    @read_only
    def said(self) -> list[str]:
        return [r[0] for r in self.db.execute("SELECT text FROM said")]

    def retag_then_fail(self) -> None:
        for conn in self.connections():
            conn.set_tags("changed")
        raise ValueError("rolled back, tags and all")

    def shout(self, text: str, size: int = 0, tag: str | None = None) -> int:
        return self.broadcast(text + "x" * size, tag=tag)


@pytest.fixture
def node(sw_bucket: S3Bucket) -> Iterator[ServedNode]:
    settings = ServerSettings(max_socket_buffer=256 << 10, socket_resume_grace=3.0)
    with served_node(sw_bucket, "n1", settings, classes=[Lobby]) as served:
        yield served


def ws_url(node: ServedNode, path: str) -> str:
    return f"ws://127.0.0.1:{node.public_port}{path}"


def recv_text(sock: CellSocket, timeout: float = 10) -> str:
    return str(sock.recv(timeout=timeout))


def call(node: ServedNode, method: str, **kwargs: Any) -> Any:
    answer = httpx.post(f"{node.public}/cells/Lobby/l/{method}", json=kwargs, timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.json()["result"]


def test_tags_attachments_and_connections(node: ServedNode) -> None:
    with (
        CellSocket([node.public], "Lobby", "l", tags=["red"]) as red,
        CellSocket([node.public], "Lobby", "l") as blue,
    ):
        blue.send("team:blue")
        blue.send("to blue")
        assert recv_text(blue) == "to blue"
        red.send("to red")
        assert recv_text(red) == "to red"
        assert call(node, "shout", text="all") == 2
        assert recv_text(red) == "all" and recv_text(blue) == "all"
        assert call(node, "shout", text="reds", tag="red") == 1
        assert recv_text(red) == "reds"
        with pytest.raises(TimeoutError):
            blue.recv(timeout=0.5)  # the red broadcast went to red only
        roster = call(node, "roster")
        assert sorted((r["tags"], r["attachment"], r["kind"]) for r in roster) == [
            (["blue"], {"n": 2}, "websocket"),
            (["red"], {"n": 1}, "websocket"),
        ]
        # A transaction that rolls back leaves the sockets as they were.
        failed = httpx.post(f"{node.public}/cells/Lobby/l/retag_then_fail", json={}, timeout=30)
        assert failed.status_code == 422
        assert sorted(r["tags"] for r in call(node, "roster")) == [["blue"], ["red"]]
        assert call(node, "shout", text="reds again", tag="red") == 1
        assert recv_text(red) == "reds again"
        blue.send(b"\x01\x02")
        assert blue.recv(timeout=10) == b"\x02\x01"  # binary frames stay binary
    # Both closed: the cell heard of it.
    deadline = time.monotonic() + 10
    while call(node, "roster") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert call(node, "roster") == []


def test_a_failed_message_sends_nothing_and_closes_its_socket(node: ServedNode) -> None:
    with (
        CellSocket([node.public], "Lobby", "l") as sock,
        CellSocket([node.public], "Lobby", "l") as other,
    ):
        sock.send("boom")
        with pytest.raises(SocketClosed) as closed:
            sock.recv(timeout=10)
        assert closed.value.code == 1011 and "boom" in closed.value.reason
        other.send("after")
        assert recv_text(other) == "after"  # "never seen" was never sent
    assert call(node, "said") == ["after"]


# Slow: it pumps broadcasts until the kernel's buffers and the socket's fill (megabytes),
# which starves timing-sensitive tests beside it: it runs once, in tox -e fleet.
@pytest.mark.slow
@pytest.mark.parametrize("kind", ["ws", "events"])
def test_a_client_that_stops_reading_is_cut_off(node: ServedNode, kind: str) -> None:
    raw = raw_request(node.public_port, f"/cells/Lobby/l/{kind}", upgrade=kind == "ws", rcvbuf=4096)
    assert raw.recv(12) == (b"HTTP/1.1 101" if kind == "ws" else b"HTTP/1.1 200")
    eventually(lambda: call(node, "roster") != [])  # its on_connect is durable
    try:
        # Broadcasts the reader never reads: its buffer passes the node's limit.
        deadline = time.monotonic() + 60
        while call(node, "roster") and time.monotonic() < deadline:
            started = time.monotonic()
            call(node, "shout", text="big", size=64 << 10)
            assert time.monotonic() - started < 10  # the cell is never held up by it
        assert call(node, "roster") == []  # cut off, and the cell heard of it
    finally:
        raw.close()


def test_event_streams_carry_broadcasts_and_resume(node: ServedNode) -> None:
    with httpx.Client(timeout=30) as http:
        with http.stream("GET", f"{node.public}/cells/Lobby/l/events") as events:
            assert events.headers["content-type"].startswith("text/event-stream")
            lines = events.iter_lines()
            first = next(lines)
            assert first.startswith("retry:")
            event_id = next(lines).removeprefix("id: ")
            call(node, "shout", text="hello\nworld")
            got: list[str] = []
            for line in lines:
                got.append(line)
                if line == "" and any(g.startswith("data: world") for g in got):
                    break
            assert "data: hello" in got and "data: world" in got
            last = next(g for g in got if g.startswith("id: ")).removeprefix("id: ")
        assert last.split(".")[0] == event_id.split(".")[0]
        # Said while no stream was open: a resume (Last-Event-ID) gets it once.
        call(node, "shout", text="missed")
        with http.stream(
            "GET", f"{node.public}/cells/Lobby/l/events", headers={"Last-Event-ID": last}
        ) as events:
            lines = events.iter_lines()
            seen = [next(lines) for _ in range(6)]
            assert "data: missed" in seen
    eventually(lambda: call(node, "roster") == [])  # a stream its reader left is closed


@pytest.fixture
def guarded(sw_bucket: S3Bucket, tmp_path: Path) -> Iterator[ServedNode]:
    with served_node(sw_bucket, "n2", keyed_settings(tmp_path), classes=[Lobby]) as served:
        yield served


def test_sockets_are_authenticated_like_calls(guarded: ServedNode) -> None:
    url = ws_url(guarded, "/cells/Lobby/g/ws")
    with pytest.raises(InvalidStatus) as anonymous:
        connect(url)
    assert anonymous.value.response.status_code == 401
    with pytest.raises(InvalidStatus) as wrong:
        connect(url, additional_headers={"Authorization": "Bearer ak_nobody_0123456789abcd"})
    assert wrong.value.response.status_code == 401
    # A browser's way: the token as a subprotocol.
    alice = CellSocket([guarded.public], "Lobby", "g", token="ak_alice_0123456789abcdef")
    with alice:
        alice.send("hi")
        assert recv_text(alice) == "hi"
        # Bob may not take over Alice's socket by naming it.
        bob_token = Subprotocol("cellactors.bearer.ak_bob_0123456789abcdef01")
        resume = f"{url}?resume={alice.id}&after=0"
        with connect(resume, subprotocols=[Subprotocol("cellactors.v1"), bob_token]) as bob:
            with pytest.raises(ConnectionClosed):
                bob.recv(timeout=10)
            assert bob.close_code == 4403
        alice.send("still mine")
        assert recv_text(alice) == "still mine"


def test_pushes_the_owner_acknowledged_but_never_sent_arrive_through_the_next(
    sw_bucket: S3Bucket,
) -> None:
    """The owner acknowledges a broadcast and dies before sending it (its sends are
    dropped, then it fences): the node holding the socket sees its owner gone, syncs
    through the next owner, and the socket gets the broadcast once, with nothing else
    happening on the cell."""
    settings = ServerSettings(socket_watch_interval=0.2)
    with (
        served_node(sw_bucket, "own", settings, classes=[Lobby]) as owner,
        served_node(sw_bucket, "hold", settings, classes=[Lobby]) as holder,
    ):
        httpx.post(f"{owner.public}/cells/Lobby/w/shout", json={"text": "-"}, timeout=30)
        assert owner.node.activations.active("Lobby:w") is not None
        with CellSocket([holder.public], "Lobby", "w") as sock:
            sock.send("first")
            assert recv_text(sock) == "first"
            dropped: list[object] = []
            owner.node.pushes.transport = lambda _holder, delivery: dropped.append(delivery)
            assert httpx.post(
                f"{owner.public}/cells/Lobby/w/shout", json={"text": "lost?"}, timeout=30
            ).json() == {"result": 1}
            eventually(lambda: len(dropped) == 1)  # acknowledged, and never sent
            with pytest.raises(TimeoutError):
                sock.recv(timeout=0.5)
            owner.node.fence("the test: the owner died after its acknowledgement")
            assert recv_text(sock, timeout=20) == "lost?"
            with pytest.raises(TimeoutError):
                sock.recv(timeout=1)  # once
            assert holder.node.activations.active("Lobby:w") is not None


def test_malformed_frames_close_the_socket_and_reach_no_cell(node: ServedNode) -> None:
    """A text frame that is not UTF-8 and an unmasked client frame are protocol errors: the
    socket is closed (1007, 1002) and the cell runs nothing."""

    def handshake() -> socket.socket:
        raw = raw_request(node.public_port, "/cells/Lobby/m/ws")
        head = b""
        while b"\r\n\r\n" not in head:
            head += raw.recv(1)
        assert head.startswith(b"HTTP/1.1 101")
        return raw

    def close_code(raw: socket.socket) -> int:
        data = b""
        while True:
            chunk = raw.recv(4096)
            if not chunk:
                break
            data += chunk
            if data[:1] == b"\x88" and len(data) >= 4:
                break
        assert data[:1] == b"\x88", data  # a close frame
        return int.from_bytes(data[2:4], "big")

    mask = b"\x01\x02\x03\x04"
    payload = bytes(b ^ mask[i % 4] for i, b in enumerate(b"\xff\xfe"))
    with handshake() as raw:
        raw.sendall(b"\x81\x82" + mask + payload)  # text, masked, not UTF-8
        assert close_code(raw) == 1007
    with handshake() as raw:
        raw.sendall(b"\x81\x02hi")  # unmasked: clients must mask
        assert close_code(raw) == 1002
    answer = httpx.post(f"{node.public}/cells/Lobby/m/said", json={}, timeout=30)
    assert answer.json() == {"result": []}


class Welcome(CellActor):
    """Sends each socket a welcome from on_connect."""

    def on_connect(self, conn: Connection) -> None:
        conn.send(f"welcome {len(self.connections())}")

    def on_message(self, conn: Connection, data: str | bytes) -> None:
        self.broadcast(data)


def test_on_connect_pushes_reach_their_socket_first_and_once(sw_bucket: S3Bucket) -> None:
    """Each socket gets its own on_connect's push, after its hello and before anything it
    says, whether its push or the owner's sync reaches the node first (the first socket
    of a cell on a node syncs; the second gets its push in order)."""
    with served_node(sw_bucket, "n1", classes=[Welcome]) as node:
        for i in range(3):
            with (
                CellSocket([node.public], "Welcome", f"w{i}") as a,
                CellSocket([node.public], "Welcome", f"w{i}") as b,
            ):
                assert a.recv(timeout=10) == "welcome 1"
                assert b.recv(timeout=10) == "welcome 2"
                a.send("hi")
                assert a.recv(timeout=10) == "hi" and b.recv(timeout=10) == "hi"
