"""The owner's side of sockets: pushes leave for the nodes holding their sockets.

The replicator hands over the pushes of each acknowledged transaction, in txid order. For
each cell, the driver remembers the last push it sent each holder (none after an
activation: a new owner does not know what the last one sent), groups the pushes by holder
and sends each group naming that previous push (:class:`~cellactors.core.sockets.Delivery`),
so a holder notices a gap and asks for a sync. Sockets held here go straight to the local
hub; others through one ordered sender per holder node (a thread, sending over
:attr:`PushDriver.transport`), which retries a holder that does not answer and, once the
holder is proven gone (restarted, or unreachable past ``holder_grace``), has the cell close
its sockets there (``on_close`` with 1006).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from cellactors.actors.sockets import SOCKET_METHOD
from cellactors.core import alarms
from cellactors.core.sockets import DELIVERY_BYTES, Delivery, Holder, Push
from cellactors.errors import CallError, StaleRoute

log = logging.getLogger(__name__)


class CallCell(Protocol):
    """The node's call to any cell of the fleet (run here or forwarded)."""

    def __call__(self, cls_name: str, name: str, method: str, kwargs: dict[str, Any]) -> Any: ...


class PushTransport(Protocol):
    """Sends a delivery to a holder's internal listener; raises :class:`CallError`
    (``StaleRoute``: the holder's process is not the one named)."""

    def __call__(self, holder: Holder, delivery: Delivery) -> None: ...


class LocalHub(Protocol):
    """The sockets held on this node (the server's hub): takes a delivery without blocking."""

    def deliver(self, delivery: Delivery) -> None: ...


@dataclass
class _CellPushes:
    epoch: int
    sent: dict[str, int] = field(default_factory=dict)  # holder node -> last push sent it
    lock: threading.Lock = field(default_factory=threading.Lock)


class _Sender:
    """The ordered deliveries to one remote holder, sent by one thread."""

    def __init__(self, holder: Holder) -> None:
        self.holder = holder
        self.queue: collections.deque[Delivery] = collections.deque()
        self.ready = threading.Condition()
        self.running = False


#: How long a holder given up on is told, once reachable, to sync its sockets.
NUDGE_FOR_S = 600.0


class PushDriver:
    """Sends each cell's acknowledged pushes to the nodes holding their sockets."""

    def __init__(self, holder: Holder, call_cell: CallCell, holder_grace: float = 30.0) -> None:
        #: This node (as an owner, and as the holder of the sockets its hub holds).
        self.holder = holder
        self.node_id = holder.node
        #: How the cell of a vanished holder's sockets is told (they close, with 1006).
        self.call_cell = call_cell
        self.holder_grace = holder_grace
        self.hub: LocalHub | None = None
        self.transport: PushTransport | None = None
        self._lock = threading.Lock()
        self._cells: dict[str, _CellPushes] = {}
        self._senders: dict[str, _Sender] = {}
        self._stop = threading.Event()

    def _cell(self, cell_id: str, epoch: int) -> _CellPushes:
        with self._lock:
            state = self._cells.get(cell_id)
            if state is None or state.epoch != epoch:
                state = self._cells[cell_id] = _CellPushes(epoch)
            return state

    def pushed(self, cell_id: str, epoch: int, items: list[tuple[Push, dict[str, Holder]]]) -> None:
        """Hand on the pushes of acknowledged transactions of ``cell_id`` (in order)."""
        groups: dict[str, tuple[Holder, list[Push]]] = {}
        for push, holders in items:
            per: dict[str, list[str]] = {}
            for conn in push.conns:
                holder = holders[conn]
                per.setdefault(holder.node, []).append(conn)
                groups.setdefault(holder.node, (holder, []))
            for node, conns in per.items():
                groups[node][1].append(
                    Push(push.seq, tuple(conns), push.kind, push.data, push.code)
                )
        state = self._cell(cell_id, epoch)
        with state.lock:
            for node, (holder, pushes) in groups.items():
                prev = state.sent.get(node)
                fresh = [p for p in pushes if prev is None or p.seq > prev]
                if not fresh:
                    continue  # a sync answered with them already
                state.sent[node] = fresh[-1].seq
                for part in _parts(fresh):  # each under a holder's body limit, chained
                    self._send(holder, Delivery(cell_id, epoch, prev, part))
                    prev = part[-1].seq

    def synced(self, cell_id: str, epoch: int, holder: str, head: int) -> None:
        """A sync of ``holder`` answers with the pushes up to ``head``: later ones follow it."""
        state = self._cell(cell_id, epoch)
        with state.lock:
            state.sent[holder] = max(state.sent.get(holder, 0), head)

    def released(self, cell_id: str) -> None:
        """The cell left this node: its next owner starts without knowing what was sent."""
        with self._lock:
            self._cells.pop(cell_id, None)

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            senders = list(self._senders.values())
        for sender in senders:
            with sender.ready:
                sender.ready.notify_all()

    def _send(self, holder: Holder, delivery: Delivery) -> None:
        if holder.node == self.node_id:
            if self.hub is not None:
                self.hub.deliver(delivery)
            return
        with self._lock:
            sender = self._senders.get(holder.node)
            if sender is None or sender.holder != holder:
                sender = self._senders[holder.node] = _Sender(holder)
            start = not sender.running
            sender.running = True
        with sender.ready:
            sender.queue.append(delivery)
            sender.ready.notify()
        if start:
            threading.Thread(
                target=self._run, args=(sender,), name=f"pushes-{holder.node}", daemon=True
            ).start()

    def _run(self, sender: _Sender) -> None:
        failures, first_failure = 0, 0.0
        while not self._stop.is_set():
            with sender.ready:
                if not sender.queue:
                    sender.ready.wait(1.0)
                if not sender.queue:
                    with self._lock:
                        if not sender.queue:
                            sender.running = False
                            if self._senders.get(sender.holder.node) is sender:
                                del self._senders[sender.holder.node]
                            return
                    continue
                delivery = sender.queue[0]
            try:
                self._deliver(sender.holder, delivery)
            except CallError as err:
                now = time.monotonic()
                failures, first_failure = failures + 1, first_failure or now
                gone = isinstance(err, StaleRoute) or now - first_failure > self.holder_grace
                if not gone:
                    log.info("pushes to %s not delivered yet: %s", sender.holder.node, err)
                    self._stop.wait(alarms.delivery_backoff(failures))
                    continue
                log.warning("holder %s is gone (%s): closing its sockets", sender.holder.node, err)
                self._holder_gone(sender)
                return
            failures, first_failure = 0, 0.0
            with sender.ready:
                sender.queue.popleft()

    def _deliver(self, holder: Holder, delivery: Delivery) -> None:
        if self.transport is None:
            raise StaleRoute(f"no way to reach holder {holder.node}")
        self.transport(holder, delivery)

    def _holder_gone(self, sender: _Sender) -> None:
        with self._lock:
            if self._senders.get(sender.holder.node) is sender:
                del self._senders[sender.holder.node]
            sender.running = False
        with sender.ready:
            cells = list(dict.fromkeys(d.cell_id for d in sender.queue))
            sender.queue.clear()
        for cell_id in cells:
            cls_name, _, name = cell_id.partition(":")
            event = {"event": "lost", "holder": sender.holder.to_wire()}
            try:
                self.call_cell(cls_name, name, SOCKET_METHOD, event)
            except Exception as err:  # the next push to them tries again
                log.info("sockets of %s on %s not closed yet: %s", cell_id, sender.holder.node, err)
        self._nudge(sender.holder, cells)

    def _nudge(self, holder: Holder, cells: list[str]) -> None:
        """Tell a holder given up on (unreachable, not restarted: a partition) to sync its
        sockets of ``cells`` once it answers again, so that the ones the cells closed are
        closed on it too, instead of staying open and silent. Tried for ``NUDGE_FOR_S``."""
        deadline = time.monotonic() + NUDGE_FOR_S
        tries = 0
        pending = list(cells)
        while pending and not self._stop.is_set() and time.monotonic() < deadline:
            cell_id = pending[0]
            try:
                self._deliver(holder, Delivery(cell_id, 0, None, ()))
            except StaleRoute:
                return  # it restarted: it holds none of those sockets any more
            except CallError:
                tries += 1
                self._stop.wait(min(alarms.delivery_backoff(tries), 10.0))
                continue
            pending.pop(0)


def _parts(pushes: list[Push]) -> list[tuple[Push, ...]]:
    """``pushes`` in runs of at most :data:`~cellactors.core.sockets.DELIVERY_BYTES`."""
    parts: list[tuple[Push, ...]] = []
    run: list[Push] = []
    size = 0
    for push in pushes:
        weight = len(push.data) + 24 * len(push.conns)  # its data and its sockets' ids
        if run and size + weight > DELIVERY_BYTES:
            parts.append(tuple(run))
            run, size = [], 0
        run.append(push)
        size += weight
    return [*parts, tuple(run)]


__all__ = ["LocalHub", "PushDriver", "PushTransport"]
