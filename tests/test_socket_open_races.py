"""Opening sockets, and the races around it (each once a runtime bug, fixed).

The hello frame (``{"conn": ..., "seq": ...}``) is the first frame of every socket, also of
a second socket of a cell on one node (its ``on_connect`` pushes find the node's stream of
the cell there, so they could overtake it).

A socket resumed on a node that holds another socket of the same cell: the resume's answer
moves the node's stream of the cell to the cell's head, although it carried the pushes of
the resumed socket only; a push still on its way to the other socket is then dropped as
one the node had already, and that socket never gets it (the chat page's fleet test saw a
page miss lines this way, its node having taken the room over).

A socket being opened (or resumed) on a node while that node syncs the socket's cell:

A holder node adds a socket to its hub before its connect (or resume) has run on the cell,
so that pushes the cell sends meanwhile reach it. When the hub syncs that cell in between
(a push from a new owner, or one that may have missed another), the sync asks about that
socket too; the cell, which does not have it yet (or has it on the node it is resumed
from), answers that it is gone, and the hub closes it with 4404, although its connect (or
resume) then succeeds on the cell.

The interleaving is forced here (the connect or resume waits at a gate while the sync
runs); in a fleet it happens by itself, e.g. when a page resumes on the node taking the
cell over (the resume waits for the takeover, and the new owner's first push brings a
sync): tests/browser/test_chat_page.py.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any, cast

import pytest
from websockets.sync.client import connect
from websockets.typing import Subprotocol

from cellactors import CellActor, Node, NodeSettings
from cellactors.actors.sockets import SOCKET_METHOD, Connection
from cellactors.core import sockets
from cellactors.core.principal import Principal
from cellactors.core.sockets import Delivery, Holder, Push
from cellactors.persistence.store.s3 import S3Bucket
from cellactors.server.socket_hub import HeldSocket, SocketHub
from cellactors.server.socket_routes import SocketRoutes
from tests.helpers.runtime import TTL
from tests.helpers.served import served_node

CELL = "Quiet:room"


class Quiet(CellActor):
    """Takes sockets and sends nothing (so no push leaves the node for a holder)."""

    def on_connect(self, conn: Connection) -> None:
        pass

    def on_message(self, conn: Connection, data: str | bytes) -> None:
        pass


class Speaker(CellActor):
    """Takes sockets; ``say`` sends a line to all of them."""

    def on_connect(self, conn: Connection) -> None:
        pass

    def say(self, text: str) -> int:
        return self.broadcast(text)


class Held:
    """A delivery the owner sent this node, held back (still on its way)."""

    def __init__(self) -> None:
        self.deliveries: list[Delivery] = []

    def deliver(self, delivery: Delivery) -> None:
        self.deliveries.append(delivery)


async def resume_while_a_push_is_on_its_way(node: Node, resume: bool = True) -> list[str]:
    """Socket ``one`` is open on a hub of ``node``; a line to every socket is on its way to
    that hub when socket ``two``, opened elsewhere, is resumed there (unless not
    ``resume``); then a second line. What ``one`` was sent."""
    hub = SocketHub(here(node), run_on(node))
    hub.bind(asyncio.get_running_loop())
    routes = SocketRoutes(cast(Any, None), None, hub)  # open() needs only the hub
    to_one: list[str] = []

    async def send(push: Push) -> None:
        to_one.append(str(push.data))

    async def ignore(*args: Any) -> None:
        pass

    cell = "Speaker:room"
    one = HeldSocket(sockets.new_conn_id(), cell, 0, send, ignore)
    await routes.open(cell, None, one, "websocket", [], None)
    one.release()  # what the route does once it sent the hello
    two = sockets.new_conn_id()
    gone = Holder("n0", "127.0.0.1:11", "0" * 16)
    await asyncio.to_thread(
        node.call_cell, "Speaker", "room", SOCKET_METHOD, event_fields("connect", two, gone)
    )
    # The node socket two was opened on takes what is sent there (and is never heard of
    # again); what this node is sent is held back for a while.
    node.pushes.transport = lambda holder, delivery: None
    held = Held()
    node.pushes.hub = held
    await asyncio.to_thread(node.call_cell, "Speaker", "room", "say", {"text": "first"})
    await asyncio.wait_for(wait_until(lambda: bool(held.deliveries)), 10)
    if resume:
        resumed = HeldSocket(two, cell, 0, ignore, ignore)
        await routes.open(cell, None, resumed, "websocket", [], (two, 0))
        resumed.release()
    node.pushes.hub = hub
    for delivery in held.deliveries:  # it arrives now
        hub.on_delivery(delivery)
    await asyncio.to_thread(node.call_cell, "Speaker", "room", "say", {"text": "second"})
    await asyncio.wait_for(wait_until(lambda: "second" in to_one), 10)
    return to_one


async def wait_until(check: Callable[[], bool]) -> None:
    while not check():
        await asyncio.sleep(0.02)


def run_on(node: Node) -> Any:
    async def run_event(
        cell_id: str, fields: dict[str, Any], caller: Principal | None, key: str | None
    ) -> Any:
        cls_name, _, name = cell_id.partition(":")
        return await asyncio.to_thread(
            node.call_cell, cls_name, name, SOCKET_METHOD, fields, key=key, caller=caller
        )

    return run_event


def test_a_push_on_its_way_arrives(sw_bucket: S3Bucket) -> None:
    """The harness itself: with no resume meanwhile, the late delivery is passed on."""
    node = Node(
        sw_bucket, "n1", [Speaker], NodeSettings(lease_ttl=TTL, advertise="127.0.0.1:12")
    ).start()
    try:
        assert asyncio.run(resume_while_a_push_is_on_its_way(node, False)) == ["first", "second"]
    finally:
        node.stop()


def test_a_resume_does_not_make_another_socket_miss_a_push(sw_bucket: S3Bucket) -> None:
    node = Node(
        sw_bucket, "n1", [Speaker], NodeSettings(lease_ttl=TTL, advertise="127.0.0.1:12")
    ).start()
    try:
        assert asyncio.run(resume_while_a_push_is_on_its_way(node)) == ["first", "second"]
    finally:
        node.stop()


class Greeter(CellActor):
    """Greets each socket as it opens."""

    def on_connect(self, conn: Connection) -> None:
        conn.send("welcome")


def test_the_hello_is_the_first_frame_of_every_socket(sw_bucket: S3Bucket) -> None:
    with served_node(sw_bucket, "greets", classes=[Greeter]) as node:
        url = f"ws://127.0.0.1:{node.public_port}/cells/Greeter/g/ws"
        numbered = [Subprotocol(sockets.SUBPROTOCOL)]
        with connect(url, subprotocols=numbered) as first:
            assert "conn" in json.loads(first.recv(timeout=10))
            with connect(url, subprotocols=numbered) as second:
                assert "conn" in json.loads(second.recv(timeout=10))


def event_fields(event: str, conn: str, holder: Holder) -> dict[str, Any]:
    return {
        "event": event,
        "conn": conn,
        "holder": holder.to_wire(),
        "tags": [],
        "kind": "websocket",
    }


async def open_during_a_sync(
    node: Node, resume: tuple[str, int] | None, sync: bool = True
) -> tuple[str, list[int]]:
    """Open (or resume) a socket on a hub of ``node``, its event held at a gate while the
    hub syncs the cell (unless not ``sync``): the socket's id and the close codes it got."""
    arrived, gate = asyncio.Event(), asyncio.Event()
    opening = "resume" if resume else "connect"

    async def run_event(
        cell_id: str, fields: dict[str, Any], caller: Principal | None, key: str | None
    ) -> Any:
        if fields["event"] == opening:
            arrived.set()
            await gate.wait()
        cls_name, _, name = cell_id.partition(":")
        return await asyncio.to_thread(
            node.call_cell, cls_name, name, SOCKET_METHOD, fields, key=key, caller=caller
        )

    hub = SocketHub(here(node), run_event)
    hub.bind(asyncio.get_running_loop())
    closes: list[int] = []

    async def send(push: Push) -> None:
        pass

    async def close(code: int, reason: str) -> None:
        closes.append(code)

    conn = resume[0] if resume else sockets.new_conn_id()
    sock = HeldSocket(conn, CELL, 0, send, close)
    routes = SocketRoutes(cast(Any, None), None, hub)  # open() needs only the hub
    opened = asyncio.ensure_future(routes.open(CELL, None, sock, "websocket", [], resume))
    await asyncio.wait_for(arrived.wait(), 10)
    if sync:
        hub.sync_soon(CELL)  # what a push from a new owner brings
    await asyncio.wait_for(asyncio.gather(*list(hub._tasks)), 10)  # the sync, done
    gate.set()
    await asyncio.wait_for(opened, 10)
    await asyncio.sleep(0)  # let a close the hub started run
    return conn, closes


def here(node: Node) -> Holder:
    return Holder(node.node_id, "127.0.0.1:12", node.generation)


def start_node(bucket: S3Bucket) -> Node:
    return Node(
        bucket, "n1", [Quiet], NodeSettings(lease_ttl=TTL, advertise="127.0.0.1:12")
    ).start()


def opened_elsewhere(node: Node) -> tuple[str, int]:
    """A socket opened on another node, which went away: what a client resumes."""
    conn = sockets.new_conn_id()
    gone = Holder("n0", "127.0.0.1:11", "0" * 16)
    node.call_cell("Quiet", "room", SOCKET_METHOD, event_fields("connect", conn, gone))
    return conn, 0


@pytest.mark.parametrize("opening", ["connect", "resume"])
def test_without_a_sync_the_socket_opens(sw_bucket: S3Bucket, opening: str) -> None:
    """The harness itself: the same open, with no sync meanwhile, closes nothing."""
    node = start_node(sw_bucket)
    try:
        resume = opened_elsewhere(node) if opening == "resume" else None
        conn, closes = asyncio.run(open_during_a_sync(node, resume, sync=False))
        assert closes == []
        # The cell has the socket, held here: a sync now does not call it gone.
        fields = {"event": "sync", "holder": here(node).to_wire(), "cursors": {conn: 0}}
        answer = node.call_cell("Quiet", "room", SOCKET_METHOD, fields)
        assert answer["gone"] == [] and answer["missed"] == []
    finally:
        node.stop()


@pytest.mark.parametrize("opening", ["connect", "resume"])
def test_a_sync_of_the_cell_does_not_close_a_socket_being_opened(
    sw_bucket: S3Bucket, opening: str
) -> None:
    node = start_node(sw_bucket)
    try:
        resume = opened_elsewhere(node) if opening == "resume" else None
        _, closes = asyncio.run(open_during_a_sync(node, resume))
        assert closes == []
    finally:
        node.stop()
