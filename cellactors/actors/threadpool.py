"""A thread pool whose threads may wait on work of the same pool without starving it.

:class:`concurrent.futures.ThreadPoolExecutor` counts a thread that waits as busy. When the
tasks of a pool wait on other tasks of the same pool (an activation waiting for its cell's
``on_activate``, which calls a cell whose activation needs the pool), a full pool waits on
itself until every wait times out. Here a task that is about to wait says so
(``with pool.blocking():``) and stops counting against the cap while it waits, so the pool
may start another thread for the work queued behind it.

Threads start as tasks need them, are daemon threads (a task stuck on a hung store never
holds the interpreter at exit; a node's graceful stop finishes its work before that), and
exit after ``idle_s`` without work, so a spike leaves no threads behind. ``max_threads``
bounds them all, blocked or not: past it, waits may starve again until their timeouts.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
from collections.abc import Callable, Iterator

log = logging.getLogger(__name__)


class PoolClosed(RuntimeError):
    """The pool was shut down: it takes no new task."""


class ElasticPool:
    """Run submitted callables on up to ``cap`` threads that are not blocked (see the module's
    docstring); tasks run in submission order as threads free up."""

    def __init__(
        self, cap: int, name: str, idle_s: float = 30.0, max_threads: int | None = None
    ) -> None:
        if cap < 1:
            raise ValueError("a pool needs at least one thread")
        self.cap = cap
        self.max_threads = 4 * cap if max_threads is None else max(cap, max_threads)
        self.name = name
        self.idle_s = idle_s
        self._cond = threading.Condition(threading.Lock())
        self._tasks: collections.deque[Callable[[], object]] = collections.deque()
        self._threads = 0  # alive workers
        self._idle = 0  # workers waiting for a task
        self._blocked = 0  # workers inside blocking()
        self._peak = 0  # most workers running unblocked at once (tests)
        self._serial = 0
        self._closed = False
        self._mine = threading.local()  # set in this pool's workers

    def submit(self, task: Callable[[], object]) -> None:
        """Queue ``task``. :class:`PoolClosed` once the pool is shut down; RuntimeError when
        no thread is alive to run it and none can start (the task is not queued)."""
        with self._cond:
            if self._closed:
                raise PoolClosed(f"pool {self.name} is shut down")
            self._tasks.append(task)
            if not self._wake_or_start():
                self._tasks.pop()
                raise RuntimeError(f"pool {self.name} cannot start a thread")

    @contextlib.contextmanager
    def blocking(self) -> Iterator[None]:
        """Mark the calling worker as waiting, so it does not count against the cap; a no-op
        in threads that are not this pool's, and inside an outer ``blocking()``. When the
        wait ends the worker finishes its task even if that puts the pool above its cap
        for a while: the cap applies when a worker takes a task."""
        if not getattr(self._mine, "worker", False) or self._mine.depth:
            yield
            return
        self._mine.depth = 1
        counted = False
        try:
            with self._cond:
                self._blocked += 1
                counted = True
                self._wake_or_start()
            yield
        finally:
            self._mine.depth = 0
            if counted:
                with self._cond:
                    self._blocked -= 1

    def shutdown(self) -> None:
        """Refuse new tasks and let idle workers exit; queued tasks still run."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def threads(self) -> int:
        """Workers alive now."""
        with self._cond:
            return self._threads

    def peak_unblocked(self) -> int:
        """The most workers running unblocked when one of them took a task."""
        with self._cond:
            return self._peak

    def _running(self) -> int:
        """Workers counted against the cap: alive and not blocked (idle ones included, as
        they take the next task)."""
        return self._threads - self._blocked

    def _wake_or_start(self) -> bool:
        """With the lock held: give queued work an idle worker, or a new one under the cap.
        False only when a thread was needed, none could start, and no worker is alive to
        take the work later (a worker that is busy or blocked comes back for it)."""
        if not self._tasks:
            return True
        if len(self._tasks) <= self._idle:
            self._cond.notify()
        elif self._running() < self.cap and self._threads < self.max_threads:
            self._serial += 1
            thread = threading.Thread(
                target=self._work, name=f"{self.name}-{self._serial}", daemon=True
            )
            try:
                thread.start()
            except RuntimeError as err:  # a thread limit: the live workers take it later
                log.warning("pool %s could not start a thread: %s", self.name, err)
                return self._threads > 0
            self._threads += 1
        return True

    def _work(self) -> None:
        self._mine.worker = True
        self._mine.depth = 0
        while True:
            with self._cond:
                while not self._tasks:
                    if self._closed:
                        self._threads -= 1
                        return
                    self._idle += 1
                    woken = self._cond.wait(self.idle_s)
                    self._idle -= 1
                    if not woken and not self._tasks:
                        self._threads -= 1
                        return
                if self._running() > self.cap:  # others unblocked meanwhile: shrink back
                    self._threads -= 1
                    self._wake_or_start()
                    return
                task = self._tasks.popleft()
                self._peak = max(self._peak, self._running() - self._idle)
            try:
                task()
            except BaseException:  # a task's own failure never kills the worker
                log.exception("task of pool %s failed", self.name)
            # An idle worker holds nothing of its last task: that task's cell (its actor,
            # its runtime) may have hibernated meanwhile, and must be freed.
            del task
