"""Sockets into cells, as an adversary sees them: each test is named after a defect a
review found (a leak, a lost or misdirected push, a wrong close code, a forged event) and
asserts the behaviour that fixed it."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any, cast

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect
from websockets.typing import Subprotocol

from cellactors import CellActor, read_only
from cellactors.actors.node.pushes import PushTransport
from cellactors.actors.sockets import Connection
from cellactors.core.sockets import Delivery, Holder, Push
from cellactors.persistence.store.s3 import S3Bucket
from cellactors.server.app import ServerSettings
from cellactors.server.socket_hub import HeldSocket, SocketHub
from cellactors.socket_client import CellSocket, held_connection
from tests.helpers.runtime import eventually
from tests.helpers.served import ServedNode, served_node
from tests.helpers.sockets import keyed_settings, raw_request

V1 = Subprotocol("cellactors.v1")


class Probe(CellActor):
    """Sockets tagged at open; methods to push slowly, to list, to refuse."""

    def on_activate(self) -> None:
        self.db.execute("CREATE TABLE IF NOT EXISTS log (text TEXT)")

    def on_connect(self, conn: Connection) -> None:
        if "refuse" in conn.tags:
            raise ValueError("not you")
        if "welcome" in conn.tags:
            conn.send("welcome")
        if "bye" in conn.tags:
            conn.close(4000, "go away")

    def on_message(self, conn: Connection, data: str | bytes) -> None:
        self.db.execute("INSERT INTO log VALUES (?)", [str(data)])
        self.broadcast(data)

    def on_close(self, conn: Connection, code: int, reason: str) -> None:
        self.db.execute("INSERT INTO log VALUES (?)", [f"closed {code}"])

    def slow_shout(self, text: str, tag: str | None = None, secs: float = 1.5) -> int:
        time.sleep(secs)  # the cell is busy: socket events queue behind this call
        return self.broadcast(text, tag=tag)

    def shout(self, text: str, size: int = 0, tag: str | None = None, times: int = 1) -> int:
        n = 0
        for _ in range(times):
            n = self.broadcast(text + "x" * size, tag=tag)
        return n

    @read_only
    def roster(self) -> list[list[str]]:
        return [list(c.tags) for c in self.connections()]


def call(node: ServedNode, method: str, cell: str = "p", **kwargs: Any) -> Any:
    answer = httpx.post(f"{node.public}/cells/Probe/{cell}/{method}", json=kwargs, timeout=60)
    assert answer.status_code == 200, answer.text
    return answer.json()["result"]


def ws_url(node: ServedNode, cell: str, query: str = "") -> str:
    return f"ws://127.0.0.1:{node.public_port}/cells/Probe/{cell}/ws{query}"


@pytest.fixture
def node(sw_bucket: S3Bucket) -> Iterator[ServedNode]:
    settings = ServerSettings(max_socket_buffer=256 << 10, socket_resume_grace=5.0)
    with served_node(sw_bucket, "r1", settings, classes=[Probe]) as served:
        yield served


def _in_thread(fn: Any) -> threading.Thread:
    thread = threading.Thread(target=fn, daemon=True)
    thread.start()
    return thread


# --- 1. a resume on a node that holds other sockets of the cell -------------------------


def test_resume_on_a_node_holding_other_sockets_of_the_cell_loses_none_of_their_pushes(
    node: ServedNode,
) -> None:
    """Socket A (tag a) and socket B (tag b) of one cell are held by the same node. A push to
    A is committed while B's resume is queued behind it: the resume's answer covers B only,
    yet the owner records that node as synced up to the head (``PushDriver.synced``), so the
    push to A is dropped as 'answered by a sync already' and A never gets it."""
    with (
        CellSocket([node.public], "Probe", "r", tags=["a"]) as a,
        CellSocket([node.public], "Probe", "r", tags=["b"]) as b,
    ):
        a.send("one")
        assert a.recv(timeout=10) == "one" and b.recv(timeout=10) == "one"
        # The cell is busy 1.5 s; it then pushes to A only, and runs B's resume right after.
        _in_thread(lambda: call(node, "slow_shout", cell="r", text="for a", tag="a"))
        time.sleep(0.5)
        with connect(ws_url(node, "r", f"?resume={b.id}&after={b.seq}"), subprotocols=[V1]) as b2:
            hello = json.loads(b2.recv(timeout=20))
            assert hello["conn"] == b.id
            assert a.recv(timeout=10) == "for a"  # today: TimeoutError, the push is lost


# --- 2. a refused resume, during a delivery, hands the stranger the victim's pushes -------


def test_a_refused_resume_neither_shows_the_victims_pushes_nor_loses_them(
    sw_bucket: S3Bucket, tmp_path: Any
) -> None:
    """Bob names Alice's socket in a resume. Until the cell refuses it (4403) the hub has put
    Bob's connection in place of Alice's: a push to Alice delivered in that window is
    written to Bob's WebSocket, and Alice, put back afterwards, never gets it."""
    with served_node(sw_bucket, "r2", keyed_settings(tmp_path), classes=[Probe]) as guarded:
        alice = CellSocket([guarded.public], "Probe", "g", token="ak_alice_0123456789abcdef")
        with alice:
            alice.send("hi")
            assert alice.recv(timeout=10) == "hi"

            def shout() -> None:
                httpx.post(
                    f"{guarded.public}/cells/Probe/g/slow_shout",
                    json={"text": "secret"},
                    headers={"Authorization": "Bearer ak_alice_0123456789abcdef"},
                    timeout=60,
                )

            _in_thread(shout)
            time.sleep(0.5)
            bob_token = Subprotocol("cellactors.bearer.ak_bob_0123456789abcdef01")
            seen_by_bob: list[Any] = []
            with connect(
                ws_url(guarded, "g", f"?resume={alice.id}&after=0"),
                subprotocols=[V1, bob_token],
            ) as bob:
                try:
                    while True:
                        seen_by_bob.append(bob.recv(timeout=20))
                except (ConnectionClosed, TimeoutError):
                    pass
                assert bob.close_code == 4403
            assert not any("secret" in str(f) for f in seen_by_bob), seen_by_bob
            assert alice.recv(timeout=10) == "secret"


# --- 3. event streams: never read, and left --------------------------------------------


def hub_of(served: ServedNode) -> SocketHub:
    """The sockets a served node holds."""
    hub = served.node.pushes.hub
    assert isinstance(hub, SocketHub)
    return hub


def _raw_events(node: ServedNode, cell: str) -> socket.socket:
    raw = raw_request(node.public_port, f"/cells/Probe/{cell}/events", upgrade=False, rcvbuf=4096)
    assert raw.recv(12) == b"HTTP/1.1 200"
    return raw


@pytest.mark.slow  # pumps megabytes at a reader that never reads (see test_sockets.py)
def test_an_event_stream_that_is_never_read_is_cut_off(node: ServedNode) -> None:
    """Docs (realtime.md, Limits): unsent bytes per socket, beyond max_socket_buffer the
    socket is closed. An /events stream puts every push in an unbounded asyncio.Queue (its
    ``send`` returns at once), so the buffer accounting never sees them: a client that
    never reads holds the node's memory without bound and is never cut off."""
    raw = _raw_events(node, "e")
    try:
        eventually(lambda: call(node, "roster", cell="e") != [])
        hub = hub_of(node)
        # Pushes it never reads (the kernel's buffers take a few MiB first), until the hub
        # cuts it off, like a WebSocket that stops reading; the cell is never held up.
        deadline = time.monotonic() + 60
        while hub.sockets and time.monotonic() < deadline:
            call(node, "shout", cell="e", text="big", size=64 << 10)
        assert not hub.sockets
    finally:
        raw.close()


def test_an_event_stream_whose_client_left_is_closed_on_its_cell(node: ServedNode) -> None:
    """The stream's ``finally`` awaits the close event while the response is being
    cancelled (client disconnect): the hub forgets the socket but the cell is never told,
    so its row in _cellactors_sockets (and connections()) stays, and on_close never runs."""
    with (
        httpx.Client(timeout=30) as http,
        http.stream("GET", f"{node.public}/cells/Probe/l/events") as events,
    ):
        lines = events.iter_lines()
        assert next(lines).startswith("retry:")
        eventually(lambda: call(node, "roster", cell="l") != [])
    # The cell heard of it, like a WebSocket's client close (today: still listed after 60 s,
    # heartbeats included; only a later push to it would close it as a stray).
    eventually(lambda: call(node, "roster", cell="l") == [], timeout=20)


# --- 4. on_connect ------------------------------------------------------------------------


def test_on_connect_that_raises_refuses_the_socket_with_4403(node: ServedNode) -> None:
    """Docs: "on_connect(conn) ... Raise to refuse the socket (it is closed with 4403...)".
    Any exception but PermissionError is answered 1011 (MethodFailed is a 422)."""
    with connect(ws_url(node, "c", "?tag=refuse"), subprotocols=[V1]) as ws:
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=10)
        assert ws.close_code == 4403


def test_a_push_from_on_connect_comes_after_the_hello_frame(node: ServedNode) -> None:
    """With numbered frames the first frame is {"conn": id, "seq": n}. A push of on_connect
    (a welcome) is delivered as soon as its transaction is acknowledged, which may be before
    the connect's answer reaches the route: then it is written before the hello frame (the
    Python client's open fails on it), and the socket's cursor is set back to the head
    before it, so a later sync sends it again."""
    # Keep another socket of the cell open here, so the hub has a stream for it and passes
    # the welcome on at once instead of syncing.
    with CellSocket([node.public], "Probe", "h"):
        for _ in range(10):
            with connect(ws_url(node, "h", "?tag=welcome"), subprotocols=[V1]) as ws:
                first = json.loads(ws.recv(timeout=10))
                assert "conn" in first, f"the first frame is not the hello: {first}"
                conn, seq = first["conn"], first["seq"]
                welcome = json.loads(ws.recv(timeout=10))
                assert welcome["text"] == "welcome" and welcome["seq"] > seq
                held = hub_of(node).sockets[conn]
                assert held.cursor >= welcome["seq"], "the cursor went back"


def test_the_python_client_opens_a_socket_whose_on_connect_sends(node: ServedNode) -> None:
    """``CellSocket`` reads its first frame as the hello: when on_connect's push comes first
    (above), ``hello["conn"]`` raises KeyError out of ``Client.connect``."""
    with CellSocket([node.public], "Probe", "k"):
        for _ in range(5):
            with CellSocket([node.public], "Probe", "k", tags=["welcome"]) as sock:
                assert sock.recv(timeout=10) == "welcome"


def test_on_connect_that_closes_its_socket_closes_it_with_its_code(node: ServedNode) -> None:
    """``conn.close(4000, ...)`` in on_connect: the client gets 4000."""
    with connect(ws_url(node, "b", "?tag=bye"), subprotocols=[V1]) as ws:
        frames = []
        with pytest.raises(ConnectionClosed):
            while True:
                frames.append(ws.recv(timeout=10))
        assert ws.close_code == 4000, (ws.close_code, frames)
    assert call(node, "roster", cell="b") == []


# --- 5. the holder while its node stops ---------------------------------------------------


def test_a_stopping_holder_does_not_close_on_the_cell_sockets_it_let_go_for_resuming() -> None:
    """While a node stops (close_all: 1001, resume elsewhere) its sockets leave the hub one
    by one without telling their cell, on purpose. A push delivered meanwhile for one that
    already left is taken for a stray and closed on the cell (``close`` with 1006): if it
    runs before the client's resume elsewhere, the resume fails with 4404."""
    events: list[dict[str, Any]] = []

    async def run_event(cell: str, fields: dict[str, Any], caller: Any, key: Any) -> Any:
        events.append(fields)
        return {"epoch": 1, "head": 0, "owner": ["o", "o:1", "g"], "pushes": []}

    async def main() -> None:
        hub = SocketHub(Holder("h", "h:1", "g"), run_event)
        hub.bind(asyncio.get_running_loop())

        async def send(push: Push) -> None:
            pass

        async def close(code: int, reason: str) -> None:
            pass

        a = HeldSocket("a" * 22, "Probe:x", 0, send, close)
        b = HeldSocket("b" * 22, "Probe:x", 0, send, close)
        hub.add(a)
        hub.add(b)
        hub.caught_up("Probe:x", {"epoch": 1, "head": 0, "owner": ["o", "o:1", "g"], "pushes": []})
        hub.close_all(1001, "the node is stopping")
        hub.remove(a)  # its connection ended first (socket_routes: stopping, no close event)
        hub.on_delivery(Delivery("Probe:x", 1, 0, (Push(1, (a.id, b.id), "text", "m"),)))
        await asyncio.sleep(0.1)

    asyncio.run(main())
    assert [e for e in events if e.get("event") == "close"] == []


# --- 6. a delivery too big for the holder's body limit ------------------------------------


@pytest.mark.slow  # megabytes of pushes between two nodes
def test_a_large_transaction_of_pushes_reaches_a_socket_held_by_another_node(
    sw_bucket: S3Bucket,
) -> None:
    """POST /internal/pushes refuses a body over 16 x max(max_body_bytes, max_socket_frame)
    (413). A delivery is never split, so a transaction (or a group-committed batch) whose
    pushes to one holder weigh more is refused for ever: the owner retries it (blocking
    every later push to that holder, of every cell) and after holder_grace declares the
    holder lost and closes the sockets on the cell. Here the limits are 64 KiB, so 1 MiB
    of pushes in one transaction never arrive."""
    small = ServerSettings(
        max_body_bytes=64 << 10, max_socket_frame=64 << 10, max_socket_buffer=8 << 20
    )
    with (
        served_node(sw_bucket, "own", small, classes=[Probe]) as owner,
        served_node(sw_bucket, "hold", small, classes=[Probe]) as holder,
    ):
        call(owner, "shout", cell="big", text="-")
        assert owner.node.activations.active("Probe:big") is not None  # owned by "own"
        with CellSocket([holder.public], "Probe", "big") as sock:
            sock.send("hi")
            assert sock.recv(timeout=10) == "hi"
            assert call(owner, "shout", cell="big", text="", size=48 << 10, times=24) == 1
            got = [sock.recv(timeout=15) for _ in range(24)]
            assert len(got) == 24


# --- 7. a holder cut off from the owner for holder_grace ----------------------------------


def test_a_socket_the_owner_gave_up_on_is_not_left_open_and_silent(sw_bucket: S3Bucket) -> None:
    """The owner cannot reach a live holder for holder_grace (a partition): it has the cell
    close the holder's sockets (``lost``: rows removed, on_close 1006) and drops its queue,
    but nobody tells the holder. Once the partition heals the owner is alive (no sync from
    the watch) and no push names those sockets: the client's socket stays open for ever and
    receives nothing (a listen-only client, an event stream, never learns)."""
    from cellactors.errors import NodeUnavailable

    with (
        served_node(sw_bucket, "own", classes=[Probe]) as owner,
        served_node(sw_bucket, "hold", classes=[Probe]) as holder,
    ):
        call(owner, "shout", cell="pt", text="-")
        assert owner.node.activations.active("Probe:pt") is not None
        with CellSocket([holder.public], "Probe", "pt") as sock:
            sock.send("hi")
            assert sock.recv(timeout=10) == "hi"
            real = owner.node.pushes.transport
            owner.node.pushes.holder_grace = 1.0

            def partitioned(_holder: Any, _delivery: Any) -> None:
                raise NodeUnavailable("partitioned (the test)")

            owner.node.pushes.transport = cast(PushTransport, partitioned)
            assert call(owner, "shout", cell="pt", text="during") == 1
            eventually(lambda: call(owner, "roster", cell="pt") == [], timeout=20)
            owner.node.pushes.transport = real  # healed
            assert call(owner, "shout", cell="pt", text="after") == 0
            # Correct: the client learns its socket is gone (closed, and a resume refused).
            from cellactors.socket_client import SocketClosed

            with pytest.raises(SocketClosed):
                sock.recv(timeout=15)


# --- 8. a holder that stops (SIGTERM, drain) ----------------------------------------------


def test_a_stopping_holder_closes_its_sockets_with_1001_and_they_stay_resumable(
    sw_bucket: S3Bucket,
) -> None:
    """Docs: 'the node holding the socket stops (drain, SIGTERM) | closed with 1001 | the
    client resumes on another node'. The hub's close_all (1001, ``stopping``) runs in the
    lifespan's shutdown, which uvicorn runs only after every connection ended; before that
    uvicorn itself closes each WebSocket with 1012 (which the docs' browser snippet does not
    resume on), and the route, not stopping yet, tries to tell the cell ``close`` through a
    node that is drained: NodeUnavailable, retried by SocketHub.event for up to 30 s while
    the stop waits for the connection, then cancelled (an ASGI exception is logged)."""
    with served_node(sw_bucket, "own", classes=[Probe]) as owner:
        call(owner, "shout", cell="d", text="-")
        assert owner.node.activations.active("Probe:d") is not None
        with served_node(sw_bucket, "hold", classes=[Probe]) as holder:
            ws = held_connection(ws_url(holder, "d"), subprotocols=[V1])
            hello = json.loads(ws.recv(timeout=10))
            eventually(lambda: call(owner, "roster", cell="d") != [])
            started = time.monotonic()
            holder.runner.request_stop()
            with pytest.raises(ConnectionClosed):
                ws.recv(timeout=30)
            code = ws.close_code
            ws.close()
        stopped_in = time.monotonic() - started
        assert call(owner, "roster", cell="d") == [[]], "closed on the cell: not resumable"
        with connect(
            ws_url(owner, "d", f"?resume={hello['conn']}&after={hello['seq']}"), subprotocols=[V1]
        ) as again:
            assert json.loads(again.recv(timeout=10))["conn"] == hello["conn"]
        assert (code, stopped_in < 15) == (1001, True), (code, stopped_in)


# --- 9. the reserved socket method through the outbox -------------------------------------


class Relay(CellActor):
    """An ordinary cell whose method passes a name on to the outbox (as apps do)."""

    def relay(self, target: str, method: str, conn: str) -> str:
        return self.send("Probe", target, method, event="message", conn=conn, data="forged")


def test_the_reserved_socket_method_is_not_reachable_through_the_outbox(
    sw_bucket: S3Bucket,
) -> None:
    """``self.send("Probe", name, "_cellactors_socket", ...)`` (a class given by name is not
    checked) is delivered through node.call_cell, whose check_call lets SOCKET_METHOD
    through for any class that takes sockets: a cell can forge socket events (messages as
    any socket, ``close``, ``lost``, ``resume``) on any other cell. docs: the method is
    'never exposed; a peer's signed forward only'."""
    with (
        served_node(sw_bucket, "ob", classes=[Probe, Relay]) as node,
        CellSocket([node.public], "Probe", "o") as sock,
    ):
        answer = httpx.post(
            f"{node.public}/cells/Relay/r/relay",
            json={"target": "o", "method": "_cellactors_socket", "conn": sock.id},
            timeout=30,
        )
        del answer  # refusing it at send() is fine too
        with pytest.raises(TimeoutError):
            got = sock.recv(timeout=5)  # today: "forged", broadcast by a forged message
            raise AssertionError(f"a forged socket event ran: {got!r}")


# --- 10. a frame under the limit, to a cell owned by another node --------------------------


def test_a_frame_under_max_socket_frame_reaches_a_cell_owned_by_another_node(
    sw_bucket: S3Bucket,
) -> None:
    """A frame of up to max_socket_frame (1 MiB) is accepted by the holder, then forwarded
    to the owner as a signed call whose body (the frame plus its fields) must fit the
    owner's max_body_bytes (also 1 MiB): a frame a few bytes under the limit is refused 413
    there and the socket is closed 1011, though the same frame works when the holder owns
    the cell."""
    with (
        served_node(sw_bucket, "own", classes=[Probe]) as owner,
        served_node(sw_bucket, "hold", classes=[Probe]) as holder,
    ):
        call(owner, "shout", cell="f", text="-")
        assert owner.node.activations.active("Probe:f") is not None
        with CellSocket([holder.public], "Probe", "f") as sock:
            data = "y" * ((1 << 20) - 16)
            sock.send(data)
            assert len(sock.recv(timeout=20)) == len(data)


# --- 11. a dropped connection to a live holder ----------------------------------------------


def test_a_client_whose_connection_dropped_resumes_without_losing_pushes(
    node: ServedNode,
) -> None:
    """socket_client: 'when the socket drops for any reason but the cell's or the client's
    own close, it is resumed ... so recv yields each push once, in order'. When the TCP
    connection drops while its node lives (NAT timeout, a network change), the holder sees
    1006 and at once closes the socket on the cell (SocketRoutes.closed: on_close, row
    removed), so the resume is refused 4404 and what was pushed meanwhile is lost."""
    with CellSocket([node.public], "Probe", "x") as sock:
        sock.send("one")
        assert sock.recv(timeout=10) == "one"
        assert sock._ws is not None
        sock._ws.socket.shutdown(socket.SHUT_RDWR)  # the connection drops, no close frame
        eventually(lambda: not hub_of(node).sockets, timeout=10)
        assert call(node, "shout", cell="x", text="while away") in (0, 1)
        assert sock.recv(timeout=20) == "while away"  # today: SocketClosed(4404)


def test_on_connect_that_closes_its_socket_leaves_nothing_held(node: ServedNode) -> None:
    """With another socket of the cell held here, on_connect's close push is passed on at
    once: the writer closes the WebSocket before the connect's answer, then the route's
    ``send_text(hello)`` raises out of the handler, ``_converse``/``closed`` never run, and
    the HeldSocket stays in hub.sockets for good (counted against max_sockets)."""
    with CellSocket([node.public], "Probe", "q") as other:
        other.send("hi")
        assert other.recv(timeout=10) == "hi"  # the hub has a stream of the cell now
        hub = hub_of(node)
        for _ in range(20):  # a race (the close push against the connect's answer)
            with connect(ws_url(node, "q", "?tag=bye"), subprotocols=[V1]) as ws:
                with pytest.raises(ConnectionClosed):
                    while True:
                        ws.recv(timeout=10)
                assert ws.close_code == 4000, ws.close_code
        time.sleep(1)
        assert set(hub.sockets) == {other.id}, len(hub.sockets)


def test_a_client_that_drops_right_after_the_handshake_leaves_nothing_held(
    node: ServedNode,
) -> None:
    """Open a numbered socket and drop the TCP connection before the connect's answer
    comes back (it waits for a bucket write): ``ws.send_text(hello)`` then raises out of
    the handler, so the HeldSocket is never removed from hub.sockets (and the cell's row
    never closed). Anyone can repeat it until the node holds max_sockets ghosts and answers
    every new socket 503."""
    hub = hub_of(node)
    for _ in range(20):
        raw = raw_request(node.public_port, "/cells/Probe/z/ws", numbered=True)
        assert raw.recv(12) == b"HTTP/1.1 101"
        raw.close()
    eventually(lambda: len(hub.sockets) == 0, timeout=30)
    eventually(lambda: call(node, "roster", cell="z") == [], timeout=30)


def test_dropped_handshakes_do_not_use_up_the_nodes_sockets(sw_bucket: S3Bucket) -> None:
    """The consequence of the leak above with max_sockets=5: five dropped handshakes, and
    the node refuses every honest socket (503 node_unavailable) until it restarts."""
    with served_node(sw_bucket, "ms", ServerSettings(max_sockets=5), classes=[Probe]) as node:
        for _ in range(5):
            raw = raw_request(node.public_port, "/cells/Probe/z/ws", numbered=True)
            assert raw.recv(12) == b"HTTP/1.1 101"
            raw.close()
        eventually(lambda: len(hub_of(node).sockets) == 0, timeout=30)
        with CellSocket([node.public], "Probe", "honest", open_timeout=3) as sock:
            sock.send("hi")
            assert sock.recv(timeout=10) == "hi"


def test_an_event_stream_dropped_before_its_open_answered_leaves_nothing_held(
    node: ServedNode,
) -> None:
    """The same for /events: a client that sends the GET and leaves at once."""
    hub = hub_of(node)
    for _ in range(10):
        raw = socket.create_connection(("127.0.0.1", node.public_port))
        raw.sendall(b"GET /cells/Probe/y/events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        raw.close()
    time.sleep(3)
    assert len(hub.sockets) == 0
    eventually(lambda: call(node, "roster", cell="y") == [], timeout=10)
