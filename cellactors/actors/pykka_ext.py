"""The two kinds of actor the runtime needs beyond pykka's own, and the one module that
uses pykka's private API (``tests/test_pykka_ext.py`` pins the part of it relied on, so a
pykka upgrade that moves it fails there first).

:class:`LazyThreadingActor`, a :class:`pykka.ThreadingActor` whose thread starts with its
first message: a cell is opened in the activating thread and may then only be read inline,
never needing a thread; a stop that finds no thread started runs in the stopping thread, so
stopping thousands of such cells at once (a fence) starts none.

:class:`PooledActor`, an actor that borrows a thread from a shared pool instead of owning
one. A :class:`pykka.ThreadingActor` keeps a thread for its whole life, idle or not. Every
active cell has an ownership actor and a replicator that are idle nearly all the time, so a
node with thousands of resident cells would hold thousands of sleeping threads (each about
20 KiB of memory, and a thread start on every activation). A :class:`PooledActor` is the
same pykka actor (refs, ``tell``/``ask``, ``stop``, ``on_start``/``on_stop``, pykka's call
messages) whose messages are handled on a thread of its class's pool while it has any.

Lifecycle of a pooled actor: :meth:`start` queues ``on_start`` on the pool, and messages
that arrive meanwhile wait in the inbox (an actor that does not override ``on_start`` is
ready at once, with no task queued). Whenever the inbox is non-empty one *drain* task is
scheduled: it handles messages one at a time, in order, and never two at once for one actor
(the actor model's guarantee), and hands its thread back when the inbox is empty or after a
few messages (so a busy actor cannot hold a thread forever while others wait). After the
actor stops, any message still queued (or queued later by a racing sender) is answered with
:class:`pykka.ActorDeadError`, as pykka does.

A handler that blocks holds its pool thread while it blocks. Pools therefore never wait on
each other in a circle: ownership actors wait on replicators and cells, replicators wait
on cells and the upload pool, and each has a pool of its own. Where a handler waits on
something that may itself need a thread of its own pool (an ownership actor waiting for a
cell whose ``on_activate`` activates another cell), it waits inside ``pool.blocking()``
(see :mod:`cellactors.actors.threadpool`).
"""

from __future__ import annotations

import logging
import queue
import sys
import threading
from collections.abc import Callable
from typing import Any, TypeVar, cast

import pykka
from pykka import ActorDeadError, ActorRegistry, messages
from pykka._envelope import Envelope

from cellactors.actors.cell_gate import CellInbox
from cellactors.actors.threadpool import ElasticPool

log = logging.getLogger(__name__)

T = TypeVar("T")
L = TypeVar("L", bound="LazyThreadingActor")


class LazyThreadingActor(pykka.ThreadingActor):
    """A threading actor whose thread starts with its first message (see the module's
    docstring). Start it with :meth:`start_lazily`."""

    @staticmethod
    def _create_actor_inbox() -> CellInbox:
        return CellInbox()

    @classmethod
    def start_lazily(cls: type[L]) -> L:
        """Create and register the actor and return the actor itself; its thread starts
        with its first message."""
        actor = cls()
        ActorRegistry.register(actor.actor_ref)
        actor._start_actor_loop()
        return actor

    def _start_actor_loop(self) -> None:
        inbox = cast(CellInbox, self.actor_inbox)
        inbox.start_on_first_put(super()._start_actor_loop, self._stop_unstarted)

    def _may_stop_here(self) -> bool:
        """Whether a stop that finds no thread started may stop the actor in the stopping
        thread now (False: it is queued for the thread, like any other message)."""
        return True

    def _stop_unstarted(self, envelope: Any) -> bool:
        if not isinstance(getattr(envelope, "message", None), messages._ActorStop):
            return False
        if not self._may_stop_here():
            return False
        self._stop()  # pykka's own stop: unregistered, marked stopped, on_stop
        if envelope.reply_to is not None:
            envelope.reply_to.set(None)
        return True


def queued(ref: pykka.ActorRef[Any]) -> int:
    """How many messages wait in the actor's inbox: a hint (another thread may take or add
    one at once), read without taking any."""
    return cast("queue.Queue[Any]", ref.actor_inbox).qsize()


#: Messages one drain handles before it hands its thread back to the pool.
DRAIN_BATCH = 16


class _Inbox(queue.Queue):  # type: ignore[type-arg]
    """A FIFO inbox that schedules its actor's drain on every put."""

    def __init__(self, actor: PooledActor) -> None:
        super().__init__()
        # A strong reference on purpose: an idle pooled actor runs on no thread, so its refs
        # (through this inbox) are what keep it alive; the node drops them when it stops.
        self.actor = actor

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        super().put(item, block, timeout)
        self.actor._schedule()  # after the put: a drain that just found it empty re-checks


class PooledActor(pykka.Actor):
    """A pykka actor run on a thread pool (see the module's docstring): its node's, set in
    :attr:`pool` before it starts (a subclass may name a default)."""

    pool: ElasticPool

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._drain_lock = threading.Lock()
        self._draining = True  # until on_start has run
        super().__init__(*args, **kwargs)
        self._mailbox = cast(_Inbox, self.actor_inbox)

    @classmethod
    def start_with(
        cls, prepare: Callable[[Any], T], *args: Any, **kwargs: Any
    ) -> tuple[pykka.ActorRef[Any], T]:
        """Create the actor, run ``prepare(actor)`` in the caller's thread, then start it.

        Nothing else can reach the actor before it starts, so ``prepare`` may call its
        methods directly: work that would otherwise be its first message, without the
        hand-off to a pool thread and back. If ``prepare`` raises, the actor never starts."""
        actor = cls(*args, **kwargs)
        prepared = prepare(actor)
        ActorRegistry.register(actor.actor_ref)
        try:
            actor._start_actor_loop()
        except BaseException:
            actor.on_start_failed()
            raise
        return actor.actor_ref, prepared

    def on_start_failed(self) -> None:
        """Undo what ``start_with``'s ``prepare`` did, when the actor could not start."""

    def _create_actor_inbox(self) -> _Inbox:  # type: ignore[override]
        return _Inbox(self)

    @staticmethod
    def _create_future() -> pykka.Future[Any]:
        return pykka.ThreadingFuture()

    def _start_actor_loop(self) -> None:
        if type(self).on_start is pykka.Actor.on_start:
            # Nothing to run before the first message: ready now, without a pool thread (a
            # message that arrived meanwhile found the drain flag set, so schedule it here).
            with self._drain_lock:
                self._draining = False
            if not self._mailbox.empty():
                self._schedule()
            return
        try:
            self.pool.submit(self._setup)
        except RuntimeError as err:  # shut down, or no thread can run it: never alive
            self._mark_dead()
            raise ActorDeadError(f"{self.actor_ref} cannot start: {err}") from err

    def _setup(self) -> None:
        try:
            self._actor_loop_setup()  # on_start; pykka stops the actor if it raises
        except BaseException:  # not an Exception: pykka lets it through, the actor is dead
            self._handle_failure(*sys.exc_info())
            raise
        finally:
            self._drain()  # a dead actor's drain answers what is queued

    def _schedule(self) -> None:
        """A message arrived: start a drain unless one is running or queued."""
        with self._drain_lock:
            if self._draining:
                return
            self._draining = True
        self._submit_drain()

    def _drain(self) -> None:
        try:
            for _ in range(DRAIN_BATCH):
                if self.actor_stopped.is_set():
                    break
                try:
                    envelope = self._mailbox.get_nowait()
                except queue.Empty:
                    break
                self._handle_envelope(envelope)
        finally:
            with self._drain_lock:
                more = not self._mailbox.empty()
                self._draining = more and not self.actor_stopped.is_set()
            if self.actor_stopped.is_set():
                self._answer_dead()
            elif more:
                self._submit_drain()

    def _submit_drain(self) -> None:
        """Queue a drain (its caller holds the draining flag)."""
        try:
            self.pool.submit(self._drain)
        except RuntimeError:  # shut down, or no thread at all: nothing will run them
            self._mark_dead()
            with self._drain_lock:
                self._draining = False
            self._answer_dead()

    def _mark_dead(self) -> None:
        """The pool will never run this actor: unregistered and stopped (no ``on_stop``, which
        would need a pool thread too)."""
        ActorRegistry.unregister(self.actor_ref)
        self.actor_stopped.set()

    def _answer_dead(self) -> None:
        """Answer every message still queued: the actor stopped and will not handle it (a
        stop request is answered as done)."""
        while True:
            try:
                envelope = self._mailbox.get_nowait()
            except queue.Empty:
                return
            if envelope.reply_to is None:
                continue
            if isinstance(envelope.message, messages._ActorStop):
                envelope.reply_to.set(None)
            else:
                envelope.reply_to.set_exception(
                    exc_info=(
                        ActorDeadError,
                        ActorDeadError(f"{self.actor_ref} stopped before handling the message"),
                        None,
                    )
                )

    def _handle_envelope(self, envelope: Envelope[Any]) -> None:
        """Handle one message as pykka's own actor loop does."""
        try:
            response = self._handle_receive(envelope.message)
            if envelope.reply_to is not None:
                envelope.reply_to.set(response)
        except Exception:
            if envelope.reply_to is not None:
                log.debug("exception returned from %s to caller", self, exc_info=True)
                envelope.reply_to.set_exception()
            else:
                self._handle_failure(*sys.exc_info())
                try:
                    self.on_failure(*sys.exc_info())
                except Exception:
                    self._handle_failure(*sys.exc_info())
        except BaseException:
            log.debug("%r in %s: stopping all actors", sys.exc_info()[1], self)
            self._stop()
            with self.pool.blocking():  # other actors of this pool need threads to stop
                ActorRegistry.stop_all()
