"""The hand-off between a cell actor and its replicator.

The cell commits transactions into the channel and parks every response in the ack gate;
the replicator takes what is unshipped, uploads it, and acknowledges or fails. A lock
guards the shared state; futures are settled outside it, in txid order.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pykka

from cellactors.core.acks import AckGate, settle
from cellactors.core.txn import Txn
from cellactors.errors import NotDurable
from cellactors.tracing.spans import Context


class Outcome:
    """A finished call waiting for its acknowledgement: a value or an exception."""

    __slots__ = ("error", "reply", "value")

    def __init__(
        self, reply: pykka.Future[Any], value: Any = None, error: BaseException | None = None
    ):
        self.reply = reply
        self.value = value
        self.error = error

    def release(self) -> None:
        if self.error is not None:
            self.reply.set_exception((type(self.error), self.error, None))
        else:
            self.reply.set(self.value)


class ReplicaChannel:
    """Committed-but-unshipped transactions and held responses of one cell activation."""

    def __init__(self, acked_txid: int) -> None:
        self._lock = threading.Lock()
        self._progress = threading.Condition(self._lock)
        self.gate: AckGate[Outcome] = AckGate(acked_txid)
        self._unshipped: list[Txn] = []
        self.on_commit: Any = None  # callable that wakes the replicator
        #: Called with each transaction's commit-to-acknowledgement time, in txid order,
        #: before the answers it releases (metrics); set before the first commit.
        self.on_acked: Callable[[float], None] | None = None
        self._commit_times: dict[int, float] = {}
        #: Per txid, what the runtime must do once that transaction is durable (the new
        #: wake state of a transaction that set an alarm or sent a message).
        self._effects: dict[int, Any] = {}
        #: Per txid, the trace context of the call that committed it (when it traces).
        self._traces: dict[int, Context] = {}
        #: Per txid, the pushes (messages to sockets) it sent: they leave once it is durable.
        self._pushes: dict[int, list[Any]] = {}
        #: Until this monotonic time, the activation is still handing the cell its first
        #: message: the replicator holds ``on_activate``'s transaction back for it, so that
        #: a new cell's schema and its first write share one upload (0: not opening).
        self._opening_until = 0.0
        self._opening_linger = 0.0

    def commit(
        self,
        txn: Txn,
        effect: Any = None,
        trace: Context | None = None,
        pushes: list[Any] | None = None,
    ) -> None:
        """Queue ``txn`` for the replicator, with its ``effect``, the trace context of the
        call that committed it (its acknowledgement's span is a child of it) and the pushes
        it sent."""
        with self._lock:
            if self.gate.failed is not None:
                raise self.gate.failed
            self.gate.commit(txn.txid)
            self._unshipped.append(txn)
            if effect is not None:
                self._effects[txn.txid] = effect
            if trace is not None:
                self._traces[txn.txid] = trace
            if pushes:
                self._pushes[txn.txid] = pushes
            self._commit_times[txn.txid] = time.monotonic()
            if self._opening_linger:  # counted from on_activate's commit, however long it ran
                self._opening_until = self._commit_times[txn.txid] + self._opening_linger
        if self.on_commit is not None:
            try:
                self.on_commit()
            except Exception as err:  # the replicator is gone: nothing can be proven now
                failure = NotDurable(f"the replicator stopped; transaction {txn.txid} not shipped")
                self.fail(failure)
                raise failure from err

    def hold(self, outcome: Outcome) -> None:
        with self._lock:
            try:
                ready = self.gate.hold(outcome)
            except BaseException as err:  # the gate has failed: nothing is released
                outcome.error, outcome.value = err, None
                ready = [outcome]
        settle(ready, Outcome.release)

    def note_progress(self) -> None:
        """The cell finished a message (wakes a lingering replicator)."""
        with self._lock:
            self._opening_until = self._opening_linger = 0.0
            self._progress.notify_all()

    def opening(self, linger_s: float) -> None:
        """The activation is about to hand the cell its first message: for at most
        ``linger_s`` after the last commit before it, or until the cell finishes a message,
        the replicator waits for it."""
        with self._lock:
            self._opening_linger = linger_s
            self._opening_until = time.monotonic() + linger_s

    def opening_until(self) -> float:
        """The monotonic time until which the replicator waits for the first message (0:
        none expected)."""
        with self._lock:
            return self._opening_until

    def nudge(self) -> None:
        """Wake a replicator waiting in :meth:`wait_unshipped` (its request ended)."""
        with self._lock:
            self._progress.notify_all()

    def wait_unshipped(self, done: Callable[[], bool], timeout: float) -> bool:
        """Wait until a transaction is committed and unshipped (True), or ``done()`` holds
        or ``timeout`` passes (False); woken by :meth:`note_progress` and :meth:`nudge`."""
        with self._lock:
            self._progress.wait_for(lambda: bool(self._unshipped) or done(), max(0.0, timeout))
            return bool(self._unshipped) and not done()

    def wait_progress(self, timeout: float) -> None:
        with self._lock:
            self._progress.wait(max(0.0, timeout))

    def take(self) -> list[Txn]:
        with self._lock:
            out, self._unshipped = self._unshipped, []
            return out

    def take_effects(self, upto: int) -> list[Any]:
        """The effects of transactions up to ``upto``, in txid order (removed)."""
        with self._lock:
            done = sorted(t for t in self._effects if t <= upto)
            return [self._effects.pop(t) for t in done]

    def take_pushes(self, upto: int) -> list[Any]:
        """The pushes of transactions up to ``upto``, in txid order (removed)."""
        with self._lock:
            if not self._pushes:
                return []
            done = sorted(t for t in self._pushes if t <= upto)
            return [p for t in done for p in self._pushes.pop(t)]

    def take_traces(self, upto: int) -> list[Context]:
        """The trace contexts of transactions up to ``upto``, in txid order (removed)."""
        with self._lock:
            if not self._traces:
                return []
            done = sorted(t for t in self._traces if t <= upto)
            return [self._traces.pop(t) for t in done]

    def ack(self, upto: int) -> None:
        with self._lock:
            ready = self.gate.ack(upto)
            now = time.monotonic()
            latencies = [
                now - self._commit_times.pop(txid)
                for txid in sorted(t for t in self._commit_times if t <= self.gate.acked)
            ]
        if self.on_acked is not None:
            for latency in latencies:
                self.on_acked(latency)
        settle(ready, Outcome.release)

    def fail(self, error: BaseException) -> None:
        with self._lock:
            held = self.gate.fail(error)
            self._unshipped = []
            self._commit_times.clear()
            self._effects.clear()
            self._traces.clear()
            self._pushes.clear()
        for item in held:
            item.error, item.value = error, None
            item.release()

    @property
    def acked(self) -> int:
        with self._lock:
            return self.gate.acked

    @property
    def committed(self) -> int:
        with self._lock:
            return self.gate.committed

    @property
    def failed(self) -> BaseException | None:
        with self._lock:
            return self.gate.failed

    def idle(self) -> bool:
        """Nothing unshipped and nothing unacknowledged."""
        with self._lock:
            return not self._unshipped and self.gate.unacked == 0
