"""Who may run a cell's code right now: its own thread, or a caller's.

A cell's messages run one at a time in the cell actor's thread. A call to a read-only method
(:func:`~cellactors.actors.cell.read_only`) may instead run in the caller's thread, but only
when the cell is idle: no message queued, none taken from the mailbox and not finished, and
the cell not stopping. :class:`ExecGate` is the lock both sides take, with that test;
:class:`CellInbox` is the mailbox that counts what the cell's thread has taken from it, so a
message in hand (taken, waiting for the lock) is never overtaken.

Closing is the gate's last act: :meth:`ExecGate.close` waits for the caller running inside,
and nothing runs after it. The cell's database is closed only after it.

A cell's thread starts with its first message (:meth:`CellInbox.start_on_first_put`): a cell
that is opened in the activating thread and then only read, inline, never needs one.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


class CellInbox(queue.Queue[Any]):
    """A cell actor's mailbox: a FIFO queue that counts the messages taken from it, and
    that can start the thread which takes them when the first one arrives."""

    def _init(self, maxsize: int) -> None:
        super()._init(maxsize)
        self.taken = 0
        self._starter: Callable[[], None] | None = None
        self._unstarted: Callable[[Any], bool] = lambda _item: False
        self._starting = threading.Lock()

    def start_on_first_put(
        self, starter: Callable[[], None], unstarted: Callable[[Any], bool] | None = None
    ) -> None:
        """Run ``starter`` (which starts the thread taking from this inbox) before the
        first message is queued; at once if one is queued already. While no thread has
        started, ``unstarted(message)`` may handle a message itself, in the sender's
        thread (True: handled, not queued), as a stop does."""
        self._starter = starter
        if unstarted is not None:
            self._unstarted = unstarted
        if self.qsize():
            self._start(None)

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        if self._starter is not None and self._start(item):
            return
        super().put(item, block, timeout)

    def _start(self, item: Any) -> bool:
        """Start the thread unless it runs; True when ``item`` was handled without it. Raises
        when no thread can start: the message is not queued (its sender learns so)."""
        with self._starting:
            starter = self._starter
            if starter is None:
                return False
            if item is not None and self._unstarted(item):
                return True
            starter()
            self._starter = None
            return False

    def _get(self) -> Any:
        self.taken += 1  # under the queue's own mutex, like every _get
        return super()._get()


class ExecGate:
    """The lock of one cell actor's code and database, and whether a caller may run now."""

    def __init__(self, inbox: CellInbox) -> None:
        self._inbox = inbox
        self._lock = threading.Lock()
        self._finished = 0  # messages the cell's thread has handled (under the lock)
        self._closed = False

    @contextmanager
    def handling(self) -> Iterator[None]:
        """The cell's thread, around each message it took from its inbox."""
        with self._lock:
            try:
                yield
            finally:
                self._finished += 1

    @contextmanager
    def opening(self) -> Iterator[None]:
        """The activating thread, around the cell's activation: it runs before any call can
        reach the cell, but a message from the runtime (a snapshot's image) waits for it."""
        with self._lock:
            yield

    def run_if_idle(self, fn: Callable[[], None], stopped: Callable[[], bool]) -> bool:
        """Run ``fn`` in this thread if the cell is idle and open (``stopped()`` false);
        False, without running it, otherwise."""
        if not self._lock.acquire(blocking=False):
            return False
        try:
            inbox = self._inbox
            if self._closed or stopped() or inbox.qsize() or inbox.taken != self._finished:
                return False
            fn()
            return True
        finally:
            self._lock.release()

    def close(self) -> None:
        """Wait for whoever runs the cell's code, then let nobody run it inline again."""
        with self._lock:
            self._closed = True

    def close_if_free(self) -> bool:
        """Close now if nobody runs the cell's code; False (and still open) otherwise."""
        if not self._lock.acquire(blocking=False):
            return False
        try:
            self._closed = True
            return True
        finally:
            self._lock.release()


__all__ = ["CellInbox", "ExecGate"]
