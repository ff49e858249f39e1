"""The replicator of one cell activation: ships batches and proves them durable.

One upload in flight per cell: the actor handles one message at a time, and each ``Kick``
takes *everything* committed since the last upload (group commit). After the batch PUT
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
        if self.channel.failed is not None:
            return
        self._linger()
        txns = self.channel.take()
        if not txns:
            return
        with self._span(txns) as span:
            self._ship_batch(txns, span)

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

    def _ship_batch(self, txns: list[Txn], span: spans.Span) -> None:
        effects = self.channel.take_effects(txns[-1].txid)
        pushes = self.channel.take_pushes(txns[-1].txid)
        try:
            deadline = time.monotonic() + self.deadline_s
            if effects and self.sink is not None:
                sink = self.sink
                self._retry(lambda: sink.before_upload(effects), deadline, "wake entry")
            size = self._upload(txns, deadline, span.context())
        except NotDurable as err:
            log.warning("cell %s epoch %d: %s", self.cell_id, self.epoch, err)
            span.outcome(err)
            self.channel.fail(err)
            self.report_failure(err)
            return
        span.outcome(None)
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

    def _upload(self, txns: list[Txn], deadline: float, trace: spans.Context | None) -> int:
        """PUT the batch, then re-read ``own.json`` (each a span under ``trace``, the
        acknowledgement's, when it traces); the batch's size."""
        batch = Batch(self.cell_id, self.epoch, txns)
        body = encode_batch(batch)
        key = keys.batch_key(self.cell_id, self.epoch, batch.first, batch.last)
        put_done = threading.Event()

        def put_then_reread() -> OwnerRecord | None:
            with spans.span("cellactors.put", trace, bytes=len(body)) if trace else spans.OFF:
                self.bucket.put(key, body)
            put_done.set()
            with spans.span("cellactors.reread", trace) if trace else spans.OFF:
                return self.ownership.read_owner(self.cell_id)

        try:
            # Both requests in one pool task: no hand-off back to this actor between them
            # (the re-read still starts only after the PUT's answer).
            record = self._once(put_then_reread, deadline, "batch upload")
        except Fenced as err:
            raise NotDurable(f"batch upload could not be proven: {err}") from err
        except BucketError:  # then one request at a time, backing off between attempts
            if not put_done.is_set():
                self._retry(lambda: self.bucket.put(key, body), deadline, "batch upload")
            record = self._retry(
                lambda: self.ownership.read_owner(self.cell_id), deadline, "re-read"
            )
        if not acquire.names(record, self.ownership.node, self.epoch):
            node = record.node if record else None
            epoch = record.epoch if record else None
            raise NotDurable(
                f"ownership lost: own.json names {node!r} at epoch {epoch}, not "
                f"{self.ownership.node!r} at {self.epoch}; the write is not known durable"
            )
        return len(body)

    def _once(self, op: Callable[[], Any], deadline: float, what: str) -> Any:
        """Run ``op`` once on the request pool, waiting at most until the deadline: a
        request that hangs is abandoned there, and the write is then not proven. A store
        error is raised as it is."""
        remaining = deadline - time.monotonic()
        try:
            if remaining <= 0:
                raise concurrent.futures.TimeoutError
            return self.uploads.submit(op).result(timeout=remaining)
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
