""":class:`cellactors.actors.threadpool.ElasticPool`: a cap on unblocked threads, waits that do
not count against it, idle threads that exit, and failures that do not kill a worker."""

from __future__ import annotations

import functools
import logging
import threading
import time
import types
from collections.abc import Callable

import pytest

from cellactors.actors import threadpool
from cellactors.actors.threadpool import ElasticPool, PoolClosed


def until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.005)


def test_tasks_run_in_order_on_one_thread_and_the_cap_holds() -> None:
    pool = ElasticPool(1, "t-order")
    seen: list[int] = []
    done = threading.Event()
    for i in range(20):
        pool.submit(functools.partial(seen.append, i))
    pool.submit(done.set)
    assert done.wait(5)
    assert seen == list(range(20))
    assert pool.peak_unblocked() == 1
    pool.shutdown()


def test_no_more_than_cap_tasks_run_at_once() -> None:
    pool = ElasticPool(2, "t-cap")
    release = threading.Event()
    running = 0
    most = 0
    lock = threading.Lock()
    finished = threading.Semaphore(0)

    def task() -> None:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        release.wait(5)
        with lock:
            running -= 1
        finished.release()

    for _ in range(6):
        pool.submit(task)
    until(lambda: running == 2)
    assert pool.threads() == 2  # the other four wait in the queue, not on threads
    release.set()
    for _ in range(6):
        assert finished.acquire(timeout=5)
    assert most == 2 and pool.peak_unblocked() == 2
    pool.shutdown()


def test_a_worker_that_waits_on_queued_work_lets_it_run() -> None:
    # One thread: the first task waits for the second. Without blocking() the second
    # would stay queued behind it until the wait timed out.
    pool = ElasticPool(1, "t-blocking")
    second_ran = threading.Event()
    outcome: list[bool] = []

    def first() -> None:
        pool.submit(second_ran.set)
        with pool.blocking():
            outcome.append(second_ran.wait(5))

    pool.submit(first)
    until(lambda: bool(outcome))
    assert outcome == [True]
    assert pool.peak_unblocked() == 1  # the waiting worker did not count
    pool.shutdown()


def test_threads_started_for_blocked_workers_shrink_back_and_idle_ones_exit() -> None:
    pool = ElasticPool(1, "t-idle", idle_s=0.2)
    gates = [threading.Event() for _ in range(3)]
    waiting = threading.Semaphore(0)

    def waiter(gate: threading.Event) -> None:
        with pool.blocking():
            waiting.release()
            gate.wait(5)

    for gate in gates:
        pool.submit(functools.partial(waiter, gate))
    for _ in gates:
        assert waiting.acquire(timeout=5)  # all three wait at once on a pool of one
    assert pool.threads() == 3
    for gate in gates:
        gate.set()
    until(lambda: pool.threads() == 0)  # none stays after the spike


def test_blocking_outside_the_pool_changes_nothing() -> None:
    pool = ElasticPool(1, "t-outside")
    with pool.blocking():
        pass
    assert pool.threads() == 0
    pool.shutdown()


def test_a_failing_task_is_logged_and_its_worker_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    pool = ElasticPool(1, "t-fail")
    done = threading.Event()

    def boom() -> None:
        raise ValueError("boom")

    with caplog.at_level(logging.ERROR, logger="cellactors.actors.threadpool"):
        pool.submit(boom)
        pool.submit(done.set)
        assert done.wait(5)
    assert "task of pool t-fail failed" in caplog.text and "boom" in caplog.text
    assert pool.threads() == 1
    pool.shutdown()


def test_shutdown_refuses_new_work_but_runs_what_was_queued() -> None:
    pool = ElasticPool(1, "t-shutdown")
    hold = threading.Event()
    ran = threading.Event()
    pool.submit(lambda: hold.wait(5))
    pool.submit(ran.set)
    pool.shutdown()
    with pytest.raises(PoolClosed, match="shut down"):
        pool.submit(ran.set)
    hold.set()
    assert ran.wait(5)
    until(lambda: pool.threads() == 0)


def test_a_pool_needs_a_thread() -> None:
    with pytest.raises(ValueError):
        ElasticPool(0, "t-none")


def test_a_thread_that_cannot_start_leaves_the_task_to_the_live_workers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pool = ElasticPool(2, "t-nostart", idle_s=0.2)
    hold = threading.Event()
    ran = threading.Event()
    pool.submit(functools.partial(hold.wait, 5))
    until(lambda: pool.threads() == 1)

    class Refused(threading.Thread):
        def start(self) -> None:
            raise RuntimeError("can't start new thread")

    # Only the pool's own thread starts fail (the rest of the process is left alone).
    monkeypatch.setattr(threadpool, "threading", types.SimpleNamespace(Thread=Refused))
    pool.submit(ran.set)  # no thread can start, but the busy worker comes back for it
    assert not ran.is_set()
    hold.set()
    assert ran.wait(5)
    until(lambda: pool.threads() == 0)  # idled out: now nothing could ever run a task
    with pytest.raises(RuntimeError, match="cannot start a thread") as info:
        pool.submit(ran.set)
    assert not isinstance(info.value, PoolClosed)


def test_nested_blocking_counts_a_worker_once() -> None:
    pool = ElasticPool(1, "t-nested")
    running = 0
    most = 0
    lock = threading.Lock()
    done = threading.Semaphore(0)
    release = threading.Event()

    def child() -> None:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.05)  # long enough for a second child to overlap if the cap let it
        with lock:
            running -= 1
        done.release()

    def parent() -> None:
        with pool.blocking(), pool.blocking():
            pool.submit(child)
            pool.submit(child)
            for _ in range(2):
                assert done.acquire(timeout=5)
        release.set()

    pool.submit(parent)
    assert release.wait(10)
    assert most == 1  # one thread stood in for the blocked parent, not two
    pool.shutdown()


def test_max_threads_bounds_blocked_workers_too() -> None:
    pool = ElasticPool(1, "t-max", max_threads=2)
    go = threading.Event()
    order: list[str] = []

    def waiter(name: str) -> None:
        with pool.blocking():
            got = go.wait(0.5)
        order.append(f"{name}:{got}")

    pool.submit(functools.partial(waiter, "a"))
    pool.submit(functools.partial(waiter, "b"))
    pool.submit(go.set)  # no third thread may start for it while a and b wait
    until(lambda: len(order) == 2)
    assert order[0].endswith(":False")  # the first to finish waited out its timeout
    assert pool.threads() <= 2
    until(go.is_set)
    pool.shutdown()
