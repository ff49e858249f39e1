"""Delivery of the outbox: messages ``send`` recorded, delivered once their transaction is
durable, each with its id as the target call's idempotency key.

One worker thread per sender cell with messages, on the node hosting it. A round reads the
messages (through the cell's mailbox, so the database is only touched by its thread),
delivers those of acknowledged transactions in ``seq`` order, stops at the first failure
per target (so each sender-target pair is delivered in send order), then deletes the
delivered ones in a transaction of the sender. Undelivered messages are retried with
backoff, forever (an unknown class or method included: a fleet mid-deploy); a message whose
target refused it for good (bad arguments, a key conflict, a cycle) or whose method raised is
dropped with an error in the log. A crash
between a delivery and the deletion delivers again, and the target's idempotency record
answers without running again (within its retention window).
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

import pykka

from cellactors.actors.messages import DropOutbox, ReadOutbox
from cellactors.core import alarms
from cellactors.errors import (
    FAILED,
    NOT_RUN,
    CallError,
    InvalidCellId,
    NodeUnavailable,
    RemoteOwner,
    StaleRoute,
    UnknownCell,
)
from cellactors.persistence.runtime_tables import Message

if TYPE_CHECKING:
    from cellactors.actors.node import Node

log = logging.getLogger(__name__)

DELIVERED, DROPPED, RETRY = "delivered", "dropped", "retried"
#: How long an idle worker waits for a kick (an acknowledgement) before looking again.
IDLE_WAIT_S = 1.0


class _Worker:
    def __init__(self) -> None:
        self.kicked = threading.Event()
        self.kicked.set()


class OutboxWorkers:
    """The delivery workers of one node, at most one per sender cell."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self._lock = threading.Lock()
        self._workers: dict[str, _Worker] = {}
        self._stop = threading.Event()

    def stop(self) -> None:
        self._stop.set()

    def kick(self, cell_id: str) -> None:
        """The cell's outbox may hold deliverable messages: start (or wake) its worker."""
        with self._lock:
            if self._stop.is_set():
                return
            worker = self._workers.get(cell_id)
            if worker is not None:
                worker.kicked.set()
                return
            worker = self._workers[cell_id] = _Worker()
        threading.Thread(
            target=self._run, args=(cell_id, worker), name=f"outbox-{cell_id}", daemon=True
        ).start()

    def _run(self, cell_id: str, worker: _Worker) -> None:
        failed_rounds = 0
        try:
            while not self._stop.is_set():
                with self._lock:
                    if not worker.kicked.is_set() and failed_rounds == 0:
                        del self._workers[cell_id]  # a kick after this starts a new worker
                        return
                worker.kicked.clear()
                more, failures = self._round(cell_id)
                if failures:
                    failed_rounds += 1
                    self._stop.wait(alarms.delivery_backoff(failed_rounds))
                    worker.kicked.set()
                else:
                    failed_rounds = 0
                    if more:  # messages of unacknowledged transactions: wait for the ack
                        worker.kicked.wait(IDLE_WAIT_S)
                        worker.kicked.set()
        except Exception:
            log.exception("outbox worker of %s failed", cell_id)
        with self._lock:
            if self._workers.get(cell_id) is worker:
                del self._workers[cell_id]

    def _round(self, cell_id: str) -> tuple[bool, bool]:
        """One delivery round: (messages remain, some delivery failed)."""
        node = self.node
        timeout = node.settings.op_deadline * 2
        try:
            active = node.activate_here(cell_id)
        except (StaleRoute, NodeUnavailable):
            return False, False  # another node hosts it (and delivers), or we stop
        except CallError as err:
            log.info("outbox of %s not delivered yet: %s", cell_id, err)
            return True, True
        try:
            answer = active.cell.ask(ReadOutbox(), block=True, timeout=timeout)
            messages: list[Message] = answer[0]
            acked = int(answer[1])
        except (pykka.ActorDeadError, pykka.Timeout, CallError):
            return True, True
        if not messages:
            return False, False
        by_seq: dict[int, Message] = {m.seq: m for m in messages}
        blocked: set[str] = set()
        delivered: list[int] = []
        failures = False
        for pending in alarms.deliverable([m.pending for m in messages], acked, blocked):
            if pending.target in blocked:
                continue
            result = self._deliver(cell_id, by_seq[pending.seq])
            node.metrics.outbox.labels(result).inc()
            if result == RETRY:
                blocked.add(pending.target)
                failures = True
            else:
                delivered.append(pending.seq)
        if delivered:
            drop = DropOutbox(delivered)
            try:
                active.cell.tell(drop)
                drop.reply.get(timeout=timeout)
            except (pykka.ActorDeadError, pykka.Timeout, CallError) as err:
                log.info("delivered messages of %s not deleted yet: %s", cell_id, err)
                return True, True
        return len(delivered) < len(messages), failures

    def _deliver(self, sender: str, message: Message) -> str:
        cls_name, _, name = message.target.partition(":")
        try:
            self.node.call_cell(cls_name, name, message.method, message.kwargs, key=message.id)
        except InvalidCellId as err:
            log.error("message %s of %s dropped: %s", message.id, sender, err)
            return DROPPED
        except CallError as err:
            final = err.outcome == FAILED or (err.outcome == NOT_RUN and not err.retryable)
            # An unknown class or method may be a node of another version during a deploy:
            # retried, never dropped; as are routing answers (the call ran nowhere).
            transient = (StaleRoute, NodeUnavailable, RemoteOwner, UnknownCell)
            if final and not isinstance(err, transient):
                log.error(
                    "message %s of %s to %s.%s dropped: %s (%s)",
                    message.id,
                    sender,
                    message.target,
                    message.method,
                    err,
                    err.code,
                )
                return DROPPED
            log.info("message %s of %s not delivered yet: %s", message.id, sender, err)
            return RETRY
        return DELIVERED


__all__ = ["OutboxWorkers"]
