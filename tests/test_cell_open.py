"""Opening a cell in the activating thread (``CellActor.open_here``): its thread starts only
with its first message, and a message that arrives while ``on_activate`` runs waits for it."""

from __future__ import annotations

import concurrent.futures
import threading
from pathlib import Path
from typing import cast

import pykka
import pytest

from cellactors import CellActor, read_only
from cellactors.actors.cell_gate import CellInbox
from cellactors.actors.cell_runtime import CellRuntime
from cellactors.actors.channel import ReplicaChannel
from cellactors.actors.messages import Invoke, TakeImage
from cellactors.persistence.celldb.database import CellDatabase
from tests.helpers.runtime import eventually


class Slow(CellActor):
    """``on_activate`` waits for the test; it writes nothing, so nothing waits for an ack."""

    inside = threading.Event()
    go = threading.Event()

    def on_activate(self) -> None:
        Slow.inside.set()
        Slow.go.wait(10)

    def noop(self) -> None:
        """A method, so that the class is a valid cell."""


def own_threads(actor: CellActor) -> list[threading.Thread]:
    """Threads running ``actor``'s loop (pykka names them after the class)."""
    return [
        t
        for t in threading.enumerate()
        if t.name.startswith("Slow-") and getattr(t, "_target", None) == actor._actor_loop
    ]


def runtime(tmp_path: Path, cell_id: str = "Slow:a") -> CellRuntime:
    """A runtime with no replicator: fine for cells whose calls write nothing."""
    return CellRuntime(
        cell_id=cell_id,
        name=cell_id.split(":", 1)[1],
        epoch=1,
        database=CellDatabase(tmp_path / "a.db"),
        channel=ReplicaChannel(0),
        next_txid=1,
    )


def test_a_message_sent_while_the_cell_opens_runs_after_on_activate(tmp_path: Path) -> None:
    Slow.inside.clear()
    Slow.go.clear()
    actor = Slow.start_unopened()
    ref = actor.actor_ref
    rt = runtime(tmp_path)
    with concurrent.futures.ThreadPoolExecutor(1) as opener:
        try:
            opened = opener.submit(actor.open_here, rt)
            assert Slow.inside.wait(10)
            assert own_threads(actor) == []  # opened in the activating thread
            image = ref.ask(TakeImage(), block=False)  # as a replicator's snapshot would
            inbox = cast(CellInbox, actor.actor_inbox)
            eventually(lambda: inbox.taken == 1, timeout=10)  # its thread took it...
            assert len(own_threads(actor)) == 1
            with pytest.raises(pykka.Timeout):
                image.get(timeout=0)  # ...and waits for on_activate to end
            Slow.go.set()
            opened.result(10)
            txid, body = image.get(timeout=10)
            assert txid == 0 and body.startswith(b"SQLite format 3")
        finally:
            Slow.go.set()
            ref.stop()
            rt.database.close()


def test_a_cell_that_gets_no_message_never_starts_a_thread(tmp_path: Path) -> None:
    Slow.go.set()
    actor = Slow.start_unopened()
    rt = runtime(tmp_path)
    try:
        actor.open_here(rt)
        assert rt.trim_if_idle is not None and rt.trim_if_idle()  # the reaper's trim, inline
        assert rt.database.trims == 1
        assert own_threads(actor) == []
        assert actor.actor_ref.stop() is True  # stopped right here, as a fence stops cells
        assert own_threads(actor) == [] and not actor.actor_ref.is_alive()
        assert rt.trim_if_idle() is False  # its gate is closed: nothing runs inline after
        with pytest.raises(pykka.ActorDeadError):
            actor.actor_ref.ask(TakeImage())
    finally:
        actor.actor_ref.stop()
        rt.database.close()


class Reader(CellActor):
    """A read-only method that waits for the test."""

    inside = threading.Event()
    go = threading.Event()

    @read_only
    def wait(self) -> int:
        Reader.inside.set()
        Reader.go.wait(10)
        return 1


def test_a_stop_behind_an_inline_read_waits_for_it_like_any_stop(tmp_path: Path) -> None:
    Reader.inside.clear()
    Reader.go.clear()
    actor = Reader.start_unopened()
    rt = runtime(tmp_path, "Reader:a")
    actor.open_here(rt)
    reply: pykka.ThreadingFuture[int] = pykka.ThreadingFuture()
    assert rt.run_inline is not None
    with concurrent.futures.ThreadPoolExecutor(1) as caller:
        try:
            ran = caller.submit(rt.run_inline, Invoke("wait", (), {}, reply))
            assert Reader.inside.wait(10)
            # The stop cannot close the gate under the read: it is queued for the cell's
            # thread (started now), and its sender's timeout applies.
            stopped = actor.actor_ref.stop(block=False)
            with pytest.raises(pykka.Timeout):
                stopped.get(timeout=0.2)
            assert not ran.done()
            Reader.go.set()
            assert ran.result(10) is True and reply.get(timeout=10) == 1
            assert stopped.get(timeout=10) is True  # once the read is over
        finally:
            Reader.go.set()
            actor.actor_ref.stop()
            rt.database.close()
