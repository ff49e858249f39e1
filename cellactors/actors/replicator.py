"""The replicator of one cell activation: ships batches and proves them durable.

At most two batches in flight per cell (the next PUT leaves once the previous one landed);
each takes *everything* committed since the last upload (group commit). After the batch PUT
succeeds it re-reads ``own.json``; only if the record still names this node at this epoch
are the held responses released. Anything else, or no proof within the deadline, fails the
held responses and resets the cell (docs/protocol.md, "Writes and the acknowledgement rule").
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

import pykka

from cellactors.actors.channel import ReplicaChannel
from cellactors.actors.messages import Flush, Kick, TakeImage
from cellactors.actors.pools import NodePools
from cellactors.actors.pykka_ext import PooledActor, queued
from cellactors.actors.snapshots import ChainState, SnapshotPolicy, SnapshotWorker
from cellactors.core import acquire, keys
from cellactors.core.txn import Txn
from cellactors.errors import BucketError, CallError, Fenced, NotDurable
from cellactors.persistence.control.ownership import OwnerRecord, OwnershipStore
from cellactors.persistence.history.batches import Batch, encode_batch
from cellactors.persistence.store.bucket import Bucket
from cellactors.tracing import spans

log = logging.getLogger(__name__)

__all__ = ["ChainState", "Replicator", "SnapshotPolicy"]

# Store requests of all replicators run here so that a hung one can be abandoned at the
# operation deadline without blocking the replicator past it.
# The threads replicators borrow while they ship (each waits on the request pool above and on
# its cell, never on another replicator).


class EffectSink(Protocol):
    """What happens around the shipping of transactions that carry effects (a new wake
    state): ``before_upload`` before their batch is uploaded (writes the wake entries they
    need, so that no durable alarm is ever without one: if the batch never lands, the entry
    is stale and costs one spurious wake; a store error is retried until the deadline, then
    the answers fail as for an upload); ``after_ack`` once they are acknowledged and the
    answers released (deletes entries no longer needed, wakes the outbox)."""

    def before_upload(self, effects: list[Any]) -> None: ...

    def after_ack(self, effects: list[Any]) -> None: ...

    def pushed(self, pushes: list[Any]) -> None:
        """The pushes of acknowledged transactions, in order: they may leave now."""


@dataclass(eq=False)
class Flight:
    """One batch on its way: sent (its PUT, then its re-read, in one request task) and not
    yet acknowledged; or already failed before it could be sent (``error``)."""

    txns: list[Txn]
    span: spans.Span
    effects: list[Any]
    pushes: list[Any]
    deadline: float
    key: str = ""
    body: bytes = b""
    task: concurrent.futures.Future[Any] | None = None
    put_done: threading.Event = field(default_factory=threading.Event)
    error: NotDurable | None = None

    def put_landed(self) -> bool:
        """Wait until the PUT has landed or the task ended (then whether the PUT landed):
        the next batch may leave only after this one's PUT, so that batches land in order
        and no later one exists without every earlier one."""
        task = self.task
        if task is None:
            return False
        while not self.put_done.is_set() and not task.done():
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                return False
            self.put_done.wait(min(remaining, 0.05))
        return self.put_done.is_set()


class Replicator(PooledActor):
    """Uploads a cell's batches, acknowledges or fails the held responses (an actor on a
    pool of its node's: a replicator with nothing to ship holds no thread)."""

    def __init__(
        self,
        cell_id: str,
        epoch: int,
        bucket: Bucket,
        ownership: OwnershipStore,
        channel: ReplicaChannel,
        report_failure: Callable[[BaseException], None],
        deadline_s: float = 15.0,
        snapshots: SnapshotPolicy | None = None,
        chain: ChainState | None = None,
        worker: SnapshotWorker | None = None,
        sink: EffectSink | None = None,
        *,
        pools: NodePools,
    ) -> None:
        super().__init__()
        self.pool = pools.replicators
        self.uploads = pools.uploads  # the store requests it waits on, with a deadline
        self.cell_id = cell_id
        self.epoch = epoch
        self.bucket = bucket
        self.ownership = ownership
        self.channel = channel
        self.report_failure = report_failure
        self.deadline_s = deadline_s
        self.policy = snapshots or SnapshotPolicy()
        self.cell_ref: pykka.ActorRef[Any] | None = None
        self.chain = chain or ChainState()
        self.worker = worker or SnapshotWorker(cell_id, epoch, bucket, self.owns, pools.snapshots)
        self._pending_snapshot: tuple[int, bytes] | None = None
        self.linger_s = 0.005
        self.sink = sink

    def on_receive(self, message: Any) -> Any:
        try:
            if isinstance(message, Kick):
                self._ship()
                return None
            if isinstance(message, Flush):
                self._ship()
                message.done.set(self.channel.failed is None)
                return None
        except Exception as err:  # never die silently with responses held behind us
            log.exception("replicator of %s failed", self.cell_id)
            failure = NotDurable(f"replication of {self.cell_id} failed: {err}")
            self.channel.fail(failure)
            self.report_failure(failure)
            if isinstance(message, Flush):
                message.done.set(False)
            return None
        return super().on_receive(message)

    def _ship(self) -> None:
        """Ship everything committed, as batches, until nothing is left: each batch's PUT
        leaves once the previous batch's PUT has landed, without waiting for that batch's
        re-read (a pipeline two deep); acknowledgements stay in txid order, each after its
        own batch's re-read."""
        if self.channel.failed is not None:
            return
        self._linger()
        txns = self.channel.take()
        if not txns:
            return
        flight: Flight | None = self._begin(txns)
        while flight is not None:
            following = self._follow(flight)
            self._finish(flight)
            if following is None and self.channel.failed is None:
                more = self.channel.take()  # committed while the batch failed or ended
                if more:
                    following = self._begin(more)
            flight = following

    def _follow(self, flight: Flight) -> Flight | None:
        """While ``flight`` is out, send the next batch as soon as anything is committed and
        ``flight``'s PUT has landed; None when ``flight`` ends first. (A lone writer's batch
        costs the replicator one wake-up, as without the pipeline: when its request ends.)"""
        task = flight.task
        if task is None:
            return None
        task.add_done_callback(lambda _task: self.channel.nudge())
        while self.channel.failed is None:
            if not self.channel.wait_unshipped(task.done, flight.deadline - time.monotonic()):
                return None  # the batch's requests ended (or the deadline passed): prove it
            if not flight.put_landed():
                return None  # its PUT failed or hangs: the next batch waits for its retry
            self._linger()
            more = self.channel.take()
            if more:
                return self._begin(more)
        return None

    def _span(self, txns: list[Txn]) -> spans.Span:
        """The acknowledgement's span (``cellactors.ack``): a child of the first traced call
        of the batch, linked to the others (a batch carries the transactions of many calls);
        none when no call of the batch traces."""
        traces = self.channel.take_traces(txns[-1].txid)
        if not traces:
            return spans.OFF
        return spans.span(
            "cellactors.ack",
            traces[0],
            links=traces[1:],
            cell=self.cell_id,
            epoch=self.epoch,
            txid=txns[-1].txid,
            txid_first=txns[0].txid,
            transactions=len(txns),
        )

    def _begin(self, txns: list[Txn]) -> Flight:
        """Write the wake entries the batch needs, then send its PUT and re-read (one pool
        task): the batch in flight."""
        span = self._span(txns).begin()
        flight = Flight(
            txns,
            span,
            self.channel.take_effects(txns[-1].txid),
            self.channel.take_pushes(txns[-1].txid),
            time.monotonic() + self.deadline_s,
        )
        try:
            if flight.effects and self.sink is not None:
                sink = self.sink
                self._retry(
                    lambda: sink.before_upload(flight.effects), flight.deadline, "wake entry"
                )
            self._send(flight)
        except NotDurable as err:
            flight.error = err
        return flight

    def _finish(self, flight: Flight) -> None:
        """Wait for the batch's proof, then acknowledge it (or fail the cell)."""
        span = flight.span
        failed = self.channel.failed
        if failed is not None:  # an earlier batch failed (and reset the cell): nothing more
            span.outcome(failed)
            span.end()
            return
        try:
            if flight.error is not None:
                raise flight.error
            size = self._prove(flight)
        except NotDurable as err:
            log.warning("cell %s epoch %d: %s", self.cell_id, self.epoch, err)
            span.outcome(err)
            span.end()
            self.channel.fail(err)
            self.report_failure(err)
            return
        span.outcome(None)
        span.end()
        txns, pushes, effects = flight.txns, flight.pushes, flight.effects
        self.channel.ack(txns[-1].txid)
        if pushes and self.sink is not None:
            try:
                self.sink.pushed(pushes)
            except Exception:  # a holder that misses one asks again (a sync)
                log.exception("the pushes of %s were not handed on", self.cell_id)
        if effects and self.sink is not None:
            try:
                self.sink.after_ack(effects)
            except Exception:  # only clean-up and wake-ups: a stale entry is harmless
                log.exception("after-acknowledgement work of %s failed", self.cell_id)
        self.chain.since_txids += len(txns)
        self.chain.since_bytes += size
        self._maybe_snapshot()

    def _linger(self) -> None:
        """Group commit: while the cell still has calls queued, give it a moment (bounded)
        to commit them, so they share this upload instead of each paying for their own. A
        cell being opened is waited for until it finishes its first message (bounded too):
        ``on_activate``'s transaction then travels with the first call's."""
        cell = self.cell_ref
        if cell is None:
            return
        now = time.monotonic()
        until = now + self.linger_s
        opening = self.channel.opening_until()
        while now < max(until, opening) and (
            (queued(cell) > 0 and now < until) or now < self.channel.opening_until()
        ):
            self.channel.wait_progress(max(until, opening) - now)
            now = time.monotonic()

    def _send(self, flight: Flight) -> None:
        """Send the batch's PUT, then the re-read of ``own.json``, in one pool task (no
        hand-off back to this actor between them; each a span under the acknowledgement's,
        when it traces)."""
        batch = Batch(self.cell_id, self.epoch, flight.txns)
        flight.body = encode_batch(batch)
        flight.key = keys.batch_key(self.cell_id, self.epoch, batch.first, batch.last)
        trace = flight.span.context()
        body, key = flight.body, flight.key

        def put_then_reread() -> OwnerRecord | None:
            with spans.span("cellactors.put", trace, bytes=len(body)) if trace else spans.OFF:
                self.bucket.put(key, body)
            flight.put_done.set()
            with spans.span("cellactors.reread", trace) if trace else spans.OFF:
                return self.ownership.read_owner(self.cell_id)

        flight.task = self.uploads.submit(put_then_reread)

    def _prove(self, flight: Flight) -> int:
        """Wait for the batch's PUT and re-read (retrying store errors one request at a
        time until the deadline); the batch's size once ``own.json`` still names this
        activation."""
        assert flight.task is not None
        try:
            record = self._wait(flight.task, flight.deadline, "batch upload")
        except Fenced as err:
            raise NotDurable(f"batch upload could not be proven: {err}") from err
        except BucketError:  # then one request at a time, backing off between attempts
            if not flight.put_done.is_set():
                body, key = flight.body, flight.key
                self._retry(lambda: self.bucket.put(key, body), flight.deadline, "batch upload")
            record = self._retry(
                lambda: self.ownership.read_owner(self.cell_id), flight.deadline, "re-read"
            )
        if not acquire.names(record, self.ownership.node, self.epoch):
            node = record.node if record else None
            epoch = record.epoch if record else None
            raise NotDurable(
                f"ownership lost: own.json names {node!r} at epoch {epoch}, not "
                f"{self.ownership.node!r} at {self.epoch}; the write is not known durable"
            )
        return len(flight.body)

    def _once(self, op: Callable[[], Any], deadline: float, what: str) -> Any:
        """Run ``op`` once on the request pool, waiting at most until the deadline: a
        request that hangs is abandoned there, and the write is then not proven. A store
        error is raised as it is."""
        if deadline - time.monotonic() <= 0:
            raise NotDurable(f"{what} could not be proven within {self.deadline_s:g}s: no answer")
        return self._wait(self.uploads.submit(op), deadline, what)

    def _wait(self, task: concurrent.futures.Future[Any], deadline: float, what: str) -> Any:
        """The result of a request task, waited for at most until the deadline."""
        try:
            return task.result(timeout=max(0.0, deadline - time.monotonic()))
        except concurrent.futures.TimeoutError:
            raise NotDurable(
                f"{what} could not be proven within {self.deadline_s:g}s: no answer"
            ) from None

    def _retry(self, op: Callable[[], Any], deadline: float, what: str) -> Any:
        """Run ``op`` (retrying store errors) until it succeeds or the deadline passes. A
        request the fence gate refused ends it at once: the node fenced itself, so nothing
        will be sent again and the write stays unproven."""
        delay = 0.05
        while True:
            try:
                return self._once(op, deadline, what)
            except Fenced as err:
                raise NotDurable(f"{what} could not be proven: {err}") from err
            except BucketError as err:
                if time.monotonic() + delay >= deadline:
                    raise NotDurable(
                        f"{what} could not be proven within {self.deadline_s:.0f}s: {err}"
                    ) from err
                time.sleep(delay)  # backoff between retries of a failing store request
                delay = min(delay * 2, 1.0)

    def owns(self) -> bool:
        """A fresh read of ``own.json`` still names this activation (snapshot GC asks)."""
        record = self.ownership.read_owner(self.cell_id)
        return acquire.names(record, self.ownership.node, self.epoch)

    def _maybe_snapshot(self) -> None:
        """Ask the cell for an image when the chain is long; upload it (off the ack path)
        once its txid is acknowledged, one snapshot at a time."""
        if (
            self._pending_snapshot is None
            and self.cell_ref is not None
            and self.policy.due(self.chain.since_txids, self.chain.since_bytes)
        ):
            try:
                self._pending_snapshot = cast(
                    "tuple[int, bytes]", self.cell_ref.ask(TakeImage(), timeout=self.deadline_s)
                )
            except (pykka.ActorDeadError, pykka.Timeout, CallError):
                return  # stopped, busy, or its storage failing: a later ack asks again
        if self._pending_snapshot is None:
            return
        txid, image = self._pending_snapshot
        if txid <= self.chain.snapshot_txid:
            self._pending_snapshot = None
            return
        if txid > self.channel.acked:
            return  # only acknowledged state may be snapshotted; wait for the ack
        if not self.worker.submit(txid, image):
            return  # one snapshot at a time; this one waits for the next ack
        self._pending_snapshot = None
        self.chain = ChainState(
            snapshot_txid=txid,
            since_txids=self.channel.acked - txid,
            since_bytes=0,
        )
