"""Who may run a cell's code right now: its own thread, or a caller's.

A cell's messages run one at a time in the cell actor's thread. A call to a read-only method
(:func:`~cellactors.actors.cell.read_only`) may instead run in the caller's thread, but only
when the cell is idle: no message queued, none taken from the mailbox and not finished, and
the cell not stopping. :class:`ExecGate` is the lock both sides take, with that test;
:class:`CellInbox` is the mailbox that counts what the cell's thread has taken from it, so a
message in hand (taken, waiting for the lock) is never overtaken.

Closing is the gate's last act: :meth:`ExecGate.close` waits for the caller running inside,
and nothing runs after it. The cell's database is closed only after it.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


class CellInbox(queue.Queue[Any]):
    """A cell actor's mailbox: a FIFO queue that counts the messages taken from it."""

    def _init(self, maxsize: int) -> None:
        super()._init(maxsize)
        self.taken = 0

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


__all__ = ["CellInbox", "ExecGate"]
