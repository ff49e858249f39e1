""":class:`cellactors.actors.pykka_ext.PooledActor`: pykka's actor contract (one message at a
time, in order; on_start before the first message; stop; dead actors answer ActorDeadError)
on threads borrowed from a shared pool."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pykka
import pytest

from cellactors.actors.messages import ask_method
from cellactors.actors.pykka_ext import PooledActor
from cellactors.actors.threadpool import ElasticPool

POOL = ElasticPool(4, "test-pooled")


class Recorder(PooledActor):
    pool = POOL
    instances: dict[str, Recorder] = {}  # by actor URN: the tests look inside

    def __init__(self) -> None:
        super().__init__()
        Recorder.instances[self.actor_urn] = self
        self.seen: list[Any] = []
        self.busy = False
        self.overlaps = 0
        self.started = False
        self.stopped = threading.Event()
        self.seen_before_start = 0

    def on_start(self) -> None:
        self.seen_before_start = len(self.seen)
        self.started = True

    def on_stop(self) -> None:
        self.stopped.set()

    def on_receive(self, message: Any) -> Any:
        if self.busy:
            self.overlaps += 1
        self.busy = True
        try:
            if isinstance(message, tuple) and message[0] == "peek":
                return len(Recorder.instances[message[1]].seen)  # another actor's progress
            if message == "boom":
                raise ValueError("boom")
            if isinstance(message, threading.Event):
                message.wait(10)
            self.seen.append(message)
            return len(self.seen)
        finally:
            self.busy = False

    def double(self, x: int) -> int:
        return 2 * x


def inside(ref: pykka.ActorRef[Any]) -> Recorder:
    return Recorder.instances[ref.actor_urn]


def test_messages_run_one_at_a_time_in_order_on_shared_threads() -> None:
    threads_before = threading.active_count()
    actors = [Recorder.start() for _ in range(50)]
    try:

        def send(sender: int) -> None:
            for i in range(40):
                for ref in actors[sender::4]:
                    ref.tell((sender, i))

        workers = [threading.Thread(target=send, args=(n,)) for n in range(4)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        for ref in actors:
            assert ref.ask("last") == 41  # everything before it was handled
            actor = inside(ref)
            assert actor.overlaps == 0
            assert actor.seen_before_start == 0 and actor.started
            mine = [m for m in actor.seen if m != "last"]
            assert mine == sorted(mine)  # one sender: its order kept
        # 50 actors, and at most the pool's 4 threads (plus the 4 senders, now gone).
        assert threading.active_count() <= threads_before + 4
    finally:
        for ref in actors:
            ref.stop()


def test_ask_returns_answers_and_errors_and_pykka_calls_work() -> None:
    ref = Recorder.start()
    try:
        assert ref.ask("a") == 1
        with pytest.raises(ValueError, match="boom"):
            ref.ask("boom")
        assert ref.ask("b") == 2  # the failure did not stop the actor
        assert ask_method(ref, "double", 21).get(timeout=5) == 42
    finally:
        ref.stop()


def test_stop_runs_on_stop_and_later_messages_are_answered_dead() -> None:
    ref = Recorder.start()
    actor = inside(ref)
    hold = threading.Event()
    ref.tell(hold)  # the actor is busy with this until released
    queued_stop = ref.ask(pykka.messages._ActorStop(), block=False)
    queued_after = ref.ask("too late", block=False)
    hold.set()
    assert queued_stop.get(timeout=5) is None
    assert actor.stopped.wait(5)
    with pytest.raises(pykka.ActorDeadError):
        queued_after.get(timeout=5)
    with pytest.raises(pykka.ActorDeadError):
        ref.tell("after stop")
    assert not ref.is_alive()


def test_a_blocked_actor_does_not_stall_the_others() -> None:
    blocked, other = Recorder.start(), Recorder.start()
    hold = threading.Event()
    try:
        blocked.tell(hold)
        assert other.ask("x", timeout=5) == 1
    finally:
        hold.set()
        blocked.stop()
        other.stop()


def test_a_busy_actor_hands_its_thread_back_between_batches() -> None:
    # One pool thread, two actors: a long queue on the first does not hold the thread
    # until it is empty.
    single = ElasticPool(1, "test-single")

    class Solo(Recorder):
        pool = single

    a, b = Solo.start(), Solo.start()
    try:
        gate = threading.Event()
        a.tell(gate)
        for i in range(100):
            a.tell(i)
        answer = b.ask(("peek", a.actor_urn), block=False)
        gate.set()
        assert answer.get(timeout=5) < 101  # b ran before a's queue ran out
        assert a.ask("end", timeout=5) == 102
    finally:
        a.stop()
        b.stop()
        single.shutdown()


def test_start_with_prepares_in_the_callers_thread_before_any_message() -> None:
    caller = threading.get_ident()
    seen: list[int] = []

    def prepare(actor: Recorder) -> str:
        seen.append(threading.get_ident())
        actor.seen.append("prepared")
        return "ready"

    ref, prepared = Recorder.start_with(prepare)
    try:
        assert prepared == "ready" and seen == [caller]
        assert ref.ask("x") == 2  # after what prepare did
        assert inside(ref).seen_before_start == 1  # on_start ran after prepare
    finally:
        ref.stop()

    def fail(actor: Recorder) -> None:
        raise RuntimeError("not this one")

    def recorders() -> set[str]:
        return {r.actor_urn for r in pykka.ActorRegistry.get_by_class(Recorder)}

    before = recorders()
    with pytest.raises(RuntimeError, match="not this one"):
        Recorder.start_with(fail)
    assert recorders() <= before  # never registered nor started


class FailingStart(Recorder):
    def on_start(self) -> None:
        raise RuntimeError("cannot start")


class Doom(BaseException):
    """Not an Exception: pykka lets it through on_start."""


class DoomedStart(Recorder):
    def on_start(self) -> None:
        raise Doom()


@pytest.mark.parametrize("cls", [FailingStart, DoomedStart], ids=["exception", "base_exception"])
def test_an_actor_whose_on_start_fails_answers_every_message_dead(cls: type[Recorder]) -> None:
    ref = cls.start()
    early = ref.ask("queued before on_start ran", block=False)
    with pytest.raises(pykka.ActorDeadError):
        early.get(timeout=5)
    assert not ref.is_alive()
    with pytest.raises(pykka.ActorDeadError):
        ref.ask("later", timeout=5)


class Failing(Recorder):
    failures: list[BaseException | None] = []

    def on_failure(self, exception_type: Any, exception_value: Any, traceback: Any) -> None:
        Failing.failures.append(exception_value)


def test_a_told_message_that_raises_stops_the_actor_after_on_failure() -> None:
    ref = Failing.start()
    hold = threading.Event()
    ref.tell(hold)
    ref.tell("boom")  # no one waits for its answer: pykka stops the actor
    behind = ref.ask("queued behind the failure", block=False)
    hold.set()
    with pytest.raises(pykka.ActorDeadError):
        behind.get(timeout=5)
    assert len(Failing.failures) == 1 and isinstance(Failing.failures[0], ValueError)
    assert not ref.is_alive()
    assert inside(ref).seen == [hold]  # nothing ran after the failure


def race_sends_with_a_stop() -> None:
    """Three senders ask while the actor stops: every ask is answered, with the handler's
    answer or ActorDeadError, and none waits for ever (a message queued after the last
    drain must still be answered)."""
    ref = Recorder.start()
    futures: list[pykka.Future[Any]] = []
    lock = threading.Lock()
    go = threading.Event()

    def send() -> None:
        go.wait(5)
        for i in range(50):
            try:
                future = ref.ask(i, block=False)
            except pykka.ActorDeadError:
                return  # refused at the door: the caller knows at once
            with lock:
                futures.append(future)

    senders = [threading.Thread(target=send) for _ in range(3)]
    for sender in senders:
        sender.start()
    go.set()
    ref.stop(block=False)
    for sender in senders:
        sender.join(10)
    answered = dead = 0
    for future in futures:
        try:
            future.get(timeout=5)
            answered += 1
        except pykka.ActorDeadError:
            dead += 1
    assert answered + dead == len(futures)
    assert answered == len(inside(ref).seen)  # an answer means it was handled


def test_messages_racing_a_stop_are_all_answered() -> None:
    for _ in range(20):
        race_sends_with_a_stop()


def test_an_actor_cannot_start_on_a_shut_down_pool() -> None:
    closed = ElasticPool(1, "test-closed")
    closed.shutdown()

    class Orphan(Recorder):
        pool = closed

    with pytest.raises(pykka.ActorDeadError, match="cannot start"):
        Orphan.start()
    assert pykka.ActorRegistry.get_by_class(Orphan) == []


def test_messages_sent_after_the_pool_shut_down_are_answered_dead() -> None:
    closing = ElasticPool(1, "test-closing")

    class Late(Recorder):
        pool = closing

    ref = Late.start()
    assert ref.ask("before", timeout=5) == 1
    closing.shutdown()
    with pytest.raises(pykka.ActorDeadError):
        ref.ask("after", timeout=5)
    assert not ref.is_alive()


def test_a_start_that_fails_undoes_what_prepare_did() -> None:
    closed = ElasticPool(1, "test-undo")
    closed.shutdown()
    undone: list[str] = []

    class Prepared(Recorder):
        pool = closed

        def on_start_failed(self) -> None:
            undone.append(self.seen[0])

    def prepare(actor: Prepared) -> None:
        actor.seen.append("opened")

    with pytest.raises(pykka.ActorDeadError):
        Prepared.start_with(prepare)
    assert undone == ["opened"]


STOP_ALL_SCRIPT = """
import time
import pykka
from cellactors.actors.pykka_ext import PooledActor
from cellactors.actors.threadpool import ElasticPool

class Doom(BaseException):
    pass

class Solo(PooledActor):
    pool = ElasticPool(1, "solo")
    def on_receive(self, message):
        if message == "doom":
            raise Doom()
        return message

a, b = Solo.start(), Solo.start()
assert b.ask("hi", timeout=5) == "hi"
a.tell("doom")  # pykka stops every actor; b's stop needs the pool's only thread
deadline = time.monotonic() + 5
while b.is_alive() and time.monotonic() < deadline:
    time.sleep(0.01)
print("deadlocked" if b.is_alive() else "stopped")
"""


def test_a_base_exception_in_a_handler_stops_every_actor_without_deadlocking_the_pool() -> None:
    # In a process of its own: pykka's answer to it is ActorRegistry.stop_all().
    out = subprocess.run(
        [sys.executable, "-c", STOP_ALL_SCRIPT],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parent.parent,  # this checkout's cellactors
    )
    assert out.stdout.strip() == "stopped", out.stdout + out.stderr


def test_an_actor_without_on_start_starts_without_a_pool_thread() -> None:
    fresh = ElasticPool(2, "test-inline")

    class Plain(PooledActor):
        pool = fresh

        def on_receive(self, message: Any) -> Any:
            return (message, threading.current_thread().name)

    ref = Plain.start()
    assert fresh.threads() == 0  # nothing ran for the start: no on_start to run
    answer, thread = ref.ask("x", timeout=5)
    assert answer == "x" and str(thread).startswith("test-inline")  # run on the pool
    ref.stop()
    fresh.shutdown()
