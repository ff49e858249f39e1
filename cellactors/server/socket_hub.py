"""The sockets this node holds, and the pushes it passes on to them.

Each socket (a WebSocket, or an event stream) is a :class:`HeldSocket`: its cell, its cursor
(the last push passed on to it) and a bounded queue of frames its writer drains. Owners send
this node :class:`~cellactors.core.sockets.Delivery` objects (from any thread); the hub
applies :func:`cellactors.core.sockets.on_push` on the event loop and, when a push may be
missing, syncs the cell: it asks the owner for everything after its sockets' cursors,
holding later deliveries until the answer is in. A client that reads too slowly (its queue
passes ``max_buffer`` bytes) is cut off with 4408 rather than holding anything up.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from cellactors.actors.sockets import from_wire
from cellactors.core import alarms, sockets
from cellactors.core.principal import Principal
from cellactors.core.sockets import Action, Delivery, Holder, Push, Stream
from cellactors.errors import UNKNOWN, CallError

log = logging.getLogger(__name__)

#: Sends a frame (a push) to the client; raises when the client is gone.
SendFrame = Callable[[Push], Awaitable[None]]
#: Closes the client's socket with a code and a reason.
CloseSocket = Callable[[int, str], Awaitable[None]]
#: Runs a socket event on a cell, wherever it is owned: (cell id, fields, caller, key).
RunEvent = Callable[[str, dict[str, Any], Principal | None, str | None], Awaitable[Any]]


class HeldSocket:
    """One socket held here: where its frames go, and how far it got."""

    __slots__ = (
        "_writer",
        "buffered",
        "cell_id",
        "close",
        "closed",
        "cursor",
        "held",
        "id",
        "queue",
        "send",
        "send_now",
    )

    def __init__(
        self, conn_id: str, cell_id: str, cursor: int, send: SendFrame, close: CloseSocket
    ) -> None:
        self.id = conn_id
        self.cell_id = cell_id
        self.cursor = cursor
        self.send = send
        self.close = close
        self.queue: collections.deque[Push] = collections.deque()
        self.buffered = 0
        self.closed = False
        #: Frames wait until the socket's open is answered (its first frame, the hello,
        #: goes before any push): :meth:`release`.
        self.held = True
        #: Writes a frame at once when the socket can take it (False: it cannot now).
        self.send_now: Callable[[Push], bool] | None = None
        self._writer: asyncio.Task[None] | None = None

    def release(self) -> None:
        """The socket is open: its queued frames may go."""
        self.held = False
        if self.queue and self._writer is None and not self.closed:
            self._writer = asyncio.get_running_loop().create_task(self._write())

    def take(self, push: Push, max_buffer: int) -> None:
        """Queue ``push`` for the client (if it is past the cursor); cut off a client whose
        queue passed ``max_buffer`` bytes."""
        if self.closed or push.seq <= self.cursor:
            return
        self.cursor = push.seq
        if (
            self.send_now is not None
            and self._writer is None
            and not self.held
            and not self.queue
            and push.kind != sockets.CLOSE
            and self.send_now(push)
        ):
            return  # written: nothing queued, no task
        self.queue.append(push)
        self.buffered += len(push.data)
        if self.buffered > max_buffer:
            self.shut(sockets.CLOSE_SLOW, "the client read too slowly")
            return
        if self._writer is None and not self.held:
            self._writer = asyncio.get_running_loop().create_task(self._write())

    async def _write(self) -> None:
        try:
            while self.queue and not self.closed:
                push = self.queue[0]
                if push.kind == sockets.CLOSE:
                    self.closed = True
                    await self.close(push.code, str(push.data))
                    return
                await self.send(push)
                self.queue.popleft()
                self.buffered -= len(push.data)
        except Exception as err:  # the client went away: its reader ends the socket
            log.debug("socket %s: send failed: %r", self.id, err)
        finally:
            self._writer = None

    def shut(self, code: int, reason: str) -> None:
        """Close the socket now, dropping what it has not sent."""
        if self.closed:
            return
        self.closed = True
        self.queue.clear()
        if self._writer is not None:
            self._writer.cancel()
        task = asyncio.ensure_future(self.close(code, reason))
        task.add_done_callback(lambda t: t.cancelled() or t.exception())


class SocketHub:
    """The sockets held on this node (see the module)."""

    def __init__(
        self,
        holder: Holder,
        run_event: RunEvent,
        *,
        max_buffer: int = 1 << 20,
        retry_for: float = 30.0,
    ) -> None:
        self.holder = holder
        self.run_event = run_event
        #: The node stops: sockets closing now are resumed elsewhere, not closed on the cell.
        self.stopping = False
        self.max_buffer = max_buffer
        self.retry_for = retry_for
        self.sockets: dict[str, HeldSocket] = {}
        self.by_cell: dict[str, set[str]] = {}
        self.streams: dict[str, Stream] = {}
        self._syncing: dict[str, list[Delivery]] = {}
        self._unsynced: dict[str, Holder] = {}  # cell -> its owner, before any push came
        self._strays: set[str] = set()  # sockets being closed on their cell
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    # --- sockets ------------------------------------------------------------------------

    def add(self, sock: HeldSocket) -> None:
        self.sockets[sock.id] = sock
        self.by_cell.setdefault(sock.cell_id, set()).add(sock.id)

    def remove(self, sock: HeldSocket) -> None:
        if self.sockets.get(sock.id) is sock:
            del self.sockets[sock.id]
            ids = self.by_cell.get(sock.cell_id)
            if ids is not None:
                ids.discard(sock.id)
                if not ids:
                    del self.by_cell[sock.cell_id]
                    self.streams.pop(sock.cell_id, None)
                    self._unsynced.pop(sock.cell_id, None)

    async def event(
        self,
        cell_id: str,
        fields: dict[str, Any],
        caller: Principal | None = None,
        key: str | None = None,
    ) -> Any:
        """Run a socket event, trying again while the cell cannot be reached and, for a
        keyed one (a message), while its outcome is unknown, for ``retry_for`` seconds;
        raises the last error after that, or any refusal at once."""
        deadline = time.monotonic() + self.retry_for
        tries = 0
        while True:
            try:
                return await self.run_event(cell_id, fields, caller, key)
            except CallError as err:
                tries += 1
                again = err.retryable or (err.outcome == UNKNOWN and key is not None)
                if not again or time.monotonic() >= deadline:
                    raise
                log.info("socket event %s of %s: trying again: %s", fields["event"], cell_id, err)
                await asyncio.sleep(min(alarms.delivery_backoff(tries), 2.0))

    # --- deliveries -----------------------------------------------------------------------

    def deliver(self, delivery: Delivery) -> None:
        """Take a delivery from any thread (the owner's replicator, or the internal app)."""
        loop = self._loop
        if loop is None:
            return  # not serving yet: a later push, or the owner's sync, brings it
        with contextlib.suppress(RuntimeError):  # the loop closed: the sockets are gone
            loop.call_soon_threadsafe(self.on_delivery, delivery)

    def on_delivery(self, delivery: Delivery) -> None:
        """Apply a delivery on the event loop (see :func:`~cellactors.core.sockets.on_push`)."""
        cell_id = delivery.cell_id
        if cell_id not in self.by_cell:
            return  # no socket of that cell here any more
        if not delivery.pushes:  # an owner that gave this node up asks it to sync
            self.sync_soon(cell_id)
            return
        held = self._syncing.get(cell_id)
        if held is not None:
            held.append(delivery)
            return
        prev = delivery.prev
        for push in delivery.pushes:
            action = sockets.on_push(self.streams.get(cell_id), delivery.epoch, prev, push.seq)
            if action is Action.SYNC:
                self._start_sync(cell_id, [delivery])
                return
            if action is Action.DELIVER:
                self.streams[cell_id].last = push.seq
                self._pass(cell_id, push)
            prev = push.seq

    def _pass(self, cell_id: str, push: Push) -> None:
        for conn_id in push.conns:
            sock = self.sockets.get(conn_id)
            if sock is not None:
                sock.take(push, self.max_buffer)
            elif conn_id not in self._strays and not self.stopping:
                self._strays.add(conn_id)  # the cell thinks it is here: tell it it is not
                self.spawn(self._stray(cell_id, conn_id))

    async def _stray(self, cell_id: str, conn_id: str) -> None:
        """Close, on the cell, a socket it believes held here that is not (its client left
        while the cell could not be told, or its open's answer was lost)."""
        fields = {
            "event": "close",
            "conn": conn_id,
            "holder": self.holder.to_wire(),
            "code": sockets.CLOSE_HOLDER_LOST,
            "reason": "the node holding it does not have it",
        }
        try:
            await self.event(cell_id, fields, None, f"ws.{conn_id}.stray")
        except CallError as err:
            log.info("stray socket %s of %s not closed: %s", conn_id, cell_id, err)
        finally:
            self._strays.discard(conn_id)

    def _start_sync(self, cell_id: str, held: list[Delivery]) -> None:
        if cell_id in self._syncing:
            self._syncing[cell_id].extend(held)
            return
        self._syncing[cell_id] = list(held)
        self.spawn(self._sync(cell_id))

    def spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def sync_soon(self, cell_id: str) -> None:
        """Ask the owner for what this node's sockets of ``cell_id`` may have missed."""
        self._start_sync(cell_id, [])

    async def _sync(self, cell_id: str) -> None:
        try:
            while cell_id in self.by_cell:
                cursors = {c: self.sockets[c].cursor for c in self.by_cell[cell_id]}
                fields = {"event": "sync", "holder": self.holder.to_wire(), "cursors": cursors}
                try:
                    answer = await self.event(cell_id, fields)
                except CallError as err:
                    log.warning("sockets of %s could not sync: %s", cell_id, err)
                    for conn_id in list(self.by_cell.get(cell_id, ())):
                        self.sockets[conn_id].shut(
                            sockets.CLOSE_TRY_LATER, "the cell is unreachable"
                        )
                    return
                self.caught_up(cell_id, answer)
                return
        finally:
            held = self._syncing.pop(cell_id, [])
            for delivery in held:
                self.on_delivery(delivery)

    def caught_up(self, cell_id: str, answer: dict[str, Any], synced: bool = True) -> None:
        """Apply a sync's answer (``synced``: the stream moves to its head) or a resume's
        (its socket's pushes only): its pushes, then the sockets it closes. A socket still
        opening is not closed for being unknown: its open has not reached the cell yet."""
        if synced:
            stream = self.streams.get(cell_id)
            head = int(answer["head"])
            epoch = int(answer["epoch"])
            owner = Holder.from_wire(answer["owner"])
            if stream is None or stream.epoch != epoch or stream.last < head:
                self.streams[cell_id] = Stream(epoch, head, owner)
        closing: set[str] = set()  # sockets the cell closed itself: they close with its code
        for push in from_wire(answer["pushes"]):
            self._pass(cell_id, push)
            if push.kind == sockets.CLOSE:
                closing.update(push.conns)
        for conn_id in answer.get("gone", ()):
            sock = self.sockets.get(str(conn_id))
            if sock is not None and not sock.held and conn_id not in closing:
                sock.shut(sockets.CLOSE_GONE, "the cell no longer has this socket")
        for conn_id in answer.get("missed", ()):
            sock = self.sockets.get(str(conn_id))
            if sock is not None:
                sock.shut(sockets.CLOSE_MISSED, "messages were lost to this socket")

    def joined(self, cell_id: str, answer: dict[str, Any]) -> None:
        """A socket of ``cell_id`` just opened (its cursor set from the connect's answer):
        without a stream from that owner, its first push brings a sync."""
        stream = self.streams.get(cell_id)
        if stream is not None and stream.epoch != int(answer["epoch"]):
            del self.streams[cell_id]
        elif stream is None:  # nothing received yet: watch the owner meanwhile
            self._unsynced[cell_id] = Holder.from_wire(answer["owner"])

    def owners(self) -> dict[Holder, list[str]]:
        """The other nodes owning cells of the sockets held here, and those cells."""
        out: dict[Holder, list[str]] = {}
        for cell_id in self.by_cell:
            stream = self.streams.get(cell_id)
            owner = stream.owner if stream is not None else self._unsynced.get(cell_id)
            if owner is not None and owner.node != self.holder.node:
                out.setdefault(owner, []).append(cell_id)
        return out

    async def watch(self, alive: Callable[[Holder], Awaitable[bool]], every: float) -> None:
        """Until cancelled: every ``every`` seconds, sync the cells whose owner is no longer
        the process it was (gone, or restarted), so that pushes it acknowledged but had
        not sent reach the sockets through the next owner even if nothing else happens."""
        while True:
            await asyncio.sleep(every)
            for owner, cells in self.owners().items():
                try:
                    ok = await alive(owner)
                except Exception:
                    ok = False
                if not ok:
                    for cell_id in cells:
                        self._unsynced.pop(cell_id, None)
                        self.sync_soon(cell_id)

    def close_all(self, code: int, reason: str) -> None:
        """Close every socket (the node is stopping): clients resume elsewhere."""
        self.stopping = True
        for sock in list(self.sockets.values()):
            sock.shut(code, reason)


__all__ = ["HeldSocket", "SocketHub"]
