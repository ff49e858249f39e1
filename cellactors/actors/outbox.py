"""Delivery of the outbox: messages ``send`` recorded, delivered once their transaction is
durable, each with its id as the target call's idempotency key.

One worker thread per sender cell with messages, on the node hosting it. A round reads the
messages (through the cell's mailbox, so the database is only touched by its thread),
delivers those of acknowledged transactions in ``seq`` order, stops at the first failure
per target (so each sender-target pair is delivered in send order), then, in one
transaction of the sender, deletes the delivered ones and moves those given up to the
sender's dead letters. Undelivered messages are retried with backoff until the node's
:class:`~cellactors.core.dead_letters.DeadLetterPolicy` gives them up: at once when the
target refused one for good (bad arguments, a key conflict, a cycle) or its method raised;
after ``outbox_max_attempts`` refusals because the target serves no such class or method (a
typo, or a fleet mid-deploy); and once one has been undelivered for ``outbox_max_age``
(its target unreachable that long). A dead letter no longer holds back the later messages
to its target; it is logged at WARNING, counted, and kept with its reason until an operator
retries it (back into the outbox, delivered under the same id) or purges it. The attempt
counts live in the delivering worker (a takeover starts them again); the age is durable.

A crash between a delivery and the deletion delivers again, and the target's idempotency
record answers without running again (within its retention window).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any, Protocol

import pykka

from cellactors.actors.cell_runtime import CellServices
from cellactors.actors.messages import EditRuntime, ReadOutbox
from cellactors.actors.metrics import NodeMetrics
from cellactors.actors.ownership import Active
from cellactors.clock import RuntimeClock
from cellactors.core import alarms
from cellactors.core.dead_letters import DeadLetterPolicy, Failure, give_up
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
from cellactors.persistence.celldb.runtime_tables import GivenUp, Message, RuntimeTables
from cellactors.tracing import spans


class OutboxSettings(Protocol):
    """The node settings the outbox reads."""

    @property
    def op_deadline(self) -> float: ...
    @property
    def outbox_max_attempts(self) -> int: ...
    @property
    def outbox_max_age(self) -> float: ...


class OutboxHost(CellServices, Protocol):
    """What the outbox needs of its node (the node is one): its settings, clock and
    metrics, how to activate a sender here, and how to call a target anywhere
    (:meth:`~cellactors.actors.cell_runtime.CellServices.call_cell`)."""

    @property
    def settings(self) -> OutboxSettings: ...
    @property
    def clock(self) -> RuntimeClock: ...
    @property
    def metrics(self) -> NodeMetrics: ...
    def activate_here(self, cell_id: str) -> Active: ...


log = logging.getLogger(__name__)

DELIVERED, DEAD_LETTERED, RETRY = "delivered", "dead_lettered", "retried"
#: How long an idle worker waits for a kick (an acknowledgement) before looking again.
IDLE_WAIT_S = 1.0


@dataclass
class _Tries:
    """The failed deliveries of one message by this worker."""

    attempts: int = 0
    unserved: int = 0  # of which the target served no such class or method
    first_ms: int = 0


@dataclass(frozen=True)
class _Outcome:
    """How one delivery went: ``result`` (:data:`DELIVERED`, :data:`RETRY` or
    :data:`DEAD_LETTERED`) and, for a letter given up, why."""

    result: str
    letter: GivenUp | None = None
    #: The delivery's outcome: ``ok``, or the failed one's (``not_run``, ``unknown``...).
    outcome: str = spans.OK


class _Worker:
    def __init__(self) -> None:
        self.kicked = threading.Event()
        self.kicked.set()
        self.tries: dict[str, _Tries] = {}  # message id -> its failed deliveries


class OutboxWorkers:
    """The delivery workers of one node, at most one per sender cell."""

    def __init__(self, node: OutboxHost) -> None:
        self.node = node
        self._lock = threading.Lock()
        self._workers: dict[str, _Worker] = {}
        self._stop = threading.Event()

    def stop(self) -> None:
        self._stop.set()

    def pending(self) -> list[str]:
        """The sender cells whose outbox a worker is delivering (or retrying); empty when
        every outbox of this node is idle."""
        with self._lock:
            return sorted(self._workers)

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
                more, failures = self._round(cell_id, worker)
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

    def _round(self, cell_id: str, worker: _Worker) -> tuple[bool, bool]:
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
        dead: dict[int, GivenUp] = {}
        failures = False
        for pending in alarms.deliverable([m.pending for m in messages], acked, blocked):
            if pending.target in blocked:
                continue
            message = by_seq[pending.seq]
            outcome = self._deliver(cell_id, message, worker)
            if outcome.result == RETRY:
                node.metrics.outbox.labels(RETRY).inc()
                blocked.add(pending.target)
                failures = True
            elif outcome.letter is not None:
                # Later messages to its target go in the next round, once its burial is
                # durable: a failover in between would otherwise retry it after them.
                dead[pending.seq] = outcome.letter
                blocked.add(pending.target)
            else:
                node.metrics.outbox.labels(DELIVERED).inc()
                delivered.append(pending.seq)
        if delivered or dead:
            now = node.clock.now_ms()
            settle = EditRuntime(lambda tables, _txid: _settle(tables, delivered, dead, now))
            try:
                active.cell.tell(settle)
                settle.reply.get(timeout=timeout)
            except (pykka.ActorDeadError, pykka.Timeout, CallError) as err:
                log.info("delivered or dead messages of %s not settled yet: %s", cell_id, err)
                return True, True
            for seq, letter in dead.items():
                self._buried(cell_id, by_seq[seq], letter, worker)
            if dead:
                worker.kicked.set()  # the messages it held back go now
        for seq in delivered:
            worker.tries.pop(by_seq[seq].id, None)
        return len(delivered) + len(dead) < len(messages), failures

    def _buried(self, sender: str, message: Message, letter: GivenUp, worker: _Worker) -> None:
        """A message moved to the dead letters, durably: logged and counted."""
        worker.tries.pop(message.id, None)
        self.node.metrics.outbox.labels(DEAD_LETTERED).inc()
        log.warning(
            "message %s of %s to %s.%s is a dead letter after %d attempt(s): %s (%s)",
            message.id,
            sender,
            message.target,
            message.method,
            letter.attempts,
            letter.reason,
            letter.code,
        )

    def _deliver(self, sender: str, message: Message, worker: _Worker) -> _Outcome:
        """Deliver one message, in a span under the sending call's (its trace goes on
        through the delivery); a failure is tried again later or given up (the node's
        dead-letter policy)."""
        with spans.span(
            "cellactors.deliver",
            spans.parent_from(message.trace),
            cell=message.target,
            method=message.method,
            sender=sender,
            message=message.id,
        ) as span:
            outcome = self._deliver_traced(sender, message, worker)
            span.set("cellactors.delivery", outcome.result)
            span.outcome(outcome.outcome)
            return outcome

    def _deliver_traced(self, sender: str, message: Message, worker: _Worker) -> _Outcome:
        cls_name, _, name = message.target.partition(":")
        try:
            self.node.call_cell(
                cls_name,
                name,
                message.method,
                message.kwargs,
                key=message.id,
                caller=message.caller,
            )
        except InvalidCellId as err:
            return self._failed(message, worker, Failure.FINAL, "bad_request", NOT_RUN, str(err))
        except CallError as err:
            kind = failure_kind(err)
            log.info("message %s of %s not delivered yet: %s", message.id, sender, err)
            return self._failed(message, worker, kind, err.code, err.outcome, str(err))
        return _Outcome(DELIVERED)

    def _failed(
        self, message: Message, worker: _Worker, kind: Failure, code: str, outcome: str, text: str
    ) -> _Outcome:
        """Count a failed delivery and decide whether the message is given up."""
        now = self.node.clock.now_ms()
        tries = worker.tries.setdefault(message.id, _Tries(first_ms=now))
        tries.attempts += 1
        tries.unserved += kind is Failure.UNSERVED
        policy = DeadLetterPolicy(
            self.node.settings.outbox_max_attempts, self.node.settings.outbox_max_age
        )
        why = give_up(policy, kind, tries.unserved, message.at_ms, now)
        if why is None:
            return _Outcome(RETRY, outcome=outcome)
        reason = f"{why}: {text}"
        return _Outcome(
            DEAD_LETTERED, GivenUp(code, outcome, reason, tries.attempts, tries.first_ms), outcome
        )


def failure_kind(err: CallError) -> Failure:
    """What a delivery's error says about trying again (see
    :mod:`cellactors.core.dead_letters`): an unknown class or method may be a node of another
    version during a deploy, and routing answers mean the call ran nowhere."""
    if isinstance(err, UnknownCell):  # UnknownMethod included
        return Failure.UNSERVED
    if isinstance(err, (StaleRoute, NodeUnavailable, RemoteOwner)):
        return Failure.TRANSIENT
    if err.outcome == FAILED or (err.outcome == NOT_RUN and not err.retryable):
        return Failure.FINAL
    return Failure.TRANSIENT


def _settle(
    tables: RuntimeTables, delivered: list[int], dead: dict[int, GivenUp], now_ms: int
) -> Any:
    """The sender's transaction after a round: delivered messages deleted, given-up ones
    moved to the dead letters (dead as of ``now_ms``)."""
    tables.remove_messages(delivered)
    for seq, letter in dead.items():
        tables.bury(seq, letter, now_ms)
    return None


__all__ = ["OutboxWorkers", "failure_kind"]
