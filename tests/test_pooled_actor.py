""":class:`cellactors.actors.pooled.PooledActor`: pykka's actor contract (one message at a
time, in order; on_start before the first message; stop; dead actors answer ActorDeadError)
on threads borrowed from a shared pool."""

from __future__ import annotations

import concurrent.futures
import threading
from typing import Any

import pykka
import pytest

from cellactors.actors.messages import ask_method
from cellactors.actors.pooled import PooledActor

POOL = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="test-pooled")


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
    single = concurrent.futures.ThreadPoolExecutor(max_workers=1)

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
        single.shutdown(wait=False)


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
