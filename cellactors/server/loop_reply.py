"""A cell's reply future that also wakes an asyncio task.

The HTTP layer hands a call for a cell active on its node straight to the cell's mailbox
(:meth:`~cellactors.actors.node.Node.submit_here`) instead of parking a worker thread on it.
The cell (or the replicator, once the write is durable) sets the reply from its own thread;
this future then schedules ``done`` on the event loop, so the request's task resumes with no
thread hop in between.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from types import TracebackType
from typing import Any

import pykka

#: What ``sys.exc_info()`` returns (pykka's own alias is private).
OptExcInfo = tuple[type[BaseException] | None, BaseException | None, TracebackType | None]


def _resolve(done: asyncio.Future[None]) -> None:
    if not done.done():
        done.set_result(None)


class LoopReply(pykka.ThreadingFuture[Any]):
    """A :class:`pykka.ThreadingFuture` that an asyncio task of ``loop`` can wait for
    (:meth:`wait`). Create it, and wait for it, on the loop's thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self.loop = loop
        self._thread = threading.get_ident()
        #: True once the value or the exception is set (before ``done`` is resolved).
        self.answered = False
        self.done: asyncio.Future[None] = loop.create_future()

    async def wait(self, interval: float) -> bool:
        """Wait until the reply is set (True) or ``interval`` seconds pass (False)."""
        if self.answered:
            return True
        timer = self.loop.call_later(interval, _resolve, self.done)
        try:
            await self.done
        finally:
            timer.cancel()
        if self.answered:
            return True
        # Timed out: a fresh ``done`` for the next wait. A setter that saw the old one had
        # already set ``answered``, which is read after the swap.
        self.done = self.loop.create_future()
        return self.answered

    def _wake(self) -> None:
        # A loop closed meanwhile has nobody left waiting on ``done``.
        with contextlib.suppress(RuntimeError):
            if threading.get_ident() == self._thread:
                # Set on the loop's own thread (a read-only call run inline): no need to
                # wake the loop through its self-pipe.
                self.loop.call_soon(_resolve, self.done)
            else:
                self.loop.call_soon_threadsafe(_resolve, self.done)

    def set(self, value: Any | None = None) -> None:
        super().set(value)
        self.answered = True
        self._wake()

    def set_exception(self, exc_info: OptExcInfo | None = None) -> None:
        super().set_exception(exc_info)
        self.answered = True
        self._wake()


__all__ = ["LoopReply"]
