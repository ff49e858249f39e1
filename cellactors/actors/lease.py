"""The lease actor: holds this node's identity in ``nodes/<node>.json``.

It takes the identity at start (waiting, with a log line, while another live process holds
it), renews every TTL/3 with If-Match, and fences the node when a renewal is rejected or
none has succeeded by the deadline. The deadline is checked by a watchdog thread on the
monotonic clock, so a renewal stuck in a slow request cannot postpone the fence.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import pykka

from cellactors.core import lease_rules
from cellactors.errors import AmbiguousWrite, BucketError
from cellactors.persistence.bucket import Applied, Match
from cellactors.persistence.leases import LeaseStore, NodeLease, now_ms

log = logging.getLogger(__name__)


class FenceDeadline:
    """The monotonic time by which the next renewal must succeed, shared with the node so
    that every call can check it without a message (a resumed, long-paused process must not
    answer even a read before its watchdog runs)."""

    def __init__(self) -> None:
        self.value = float("inf")

    def passed(self) -> bool:
        return lease_rules.should_fence(self.value, time.monotonic())


class LeaseActor(pykka.ThreadingActor):
    """Takes, renews and finally expires one node lease."""

    use_daemon_thread = True  # a stuck cell must not keep the process alive

    def __init__(
        self,
        store: LeaseStore,
        generation: str,
        addr: str,
        load: Callable[[], dict[str, Any]],
        on_fence: Callable[[str], None],
        shared_deadline: FenceDeadline | None = None,
    ) -> None:
        super().__init__()
        self.shared_deadline = shared_deadline or FenceDeadline()
        self.store = store
        self.generation = generation
        self.addr = addr
        self.load = load
        self.on_fence = on_fence
        self.ttl = store.ttl_s
        self.token: str | None = None
        self.expires_ms = 0
        self.deadline = 0.0
        self.renewals = 0
        self._stopping = threading.Event()
        self._paused = threading.Event()
        self._fenced = False
        self._watchdog: threading.Thread | None = None

    def _record(self, expires_ms: int) -> NodeLease:
        return NodeLease(
            node=self.store.node,
            addr=self.addr,
            expires_ms=expires_ms,
            generation=self.generation,
            load=self.load(),
        )

    def take(self, give_up_after: float | None = None) -> int:
        """Take our identity; blocks while another live process holds it. Returns expiry."""
        started = time.monotonic()
        announced = False
        while not self._stopping.is_set():
            current = self.store.read_lease(self.store.node)
            decision = lease_rules.decide_start(current, self.generation, now_ms())
            if isinstance(decision, lease_rules.WaitForExpiry):
                if not announced:
                    log.warning(
                        "node id %s is held by another live process (generation %s) until "
                        "%d; waiting for its lease to expire instead of fighting over it",
                        self.store.node,
                        decision.holder_generation,
                        decision.expires_ms,
                    )
                    announced = True
                if give_up_after is not None and time.monotonic() - started > give_up_after:
                    raise BucketError(f"node id {self.store.node} is held by another process")
                wait = max(0.05, min(1.0, (decision.expires_ms - now_ms()) / 1000 + 0.05))
                self._stopping.wait(wait)
                continue
            if self._write(decision.guard):
                self._start_watchdog()
                return self.expires_ms
        raise BucketError("lease actor stopped while taking the identity")

    def _write(self, guard: Any, expires_ms: int | None = None) -> bool:
        sent = time.monotonic()
        expires = now_ms() + int(self.ttl * 1000) if expires_ms is None else expires_ms
        record = self._record(expires)
        try:
            result = self.store.cas_node_lease(guard, record)
        except AmbiguousWrite:
            back = self.store.read_lease(self.store.node)
            if (
                back is None
                or back.lease.generation != self.generation
                or back.lease.expires_ms != expires
            ):
                return False
            result = Applied(back.token)
        if not isinstance(result, Applied):
            return False
        self.token = result.token
        self.expires_ms = expires
        self.deadline = lease_rules.fence_deadline(sent, self.ttl)
        if not self._paused.is_set():
            self.shared_deadline.value = self.deadline
        self.renewals += 1
        return True

    def renew(self) -> bool:
        """One renewal; a rejection fences the node."""
        if self._fenced or self.token is None or self._stopping.is_set():
            return False
        if lease_rules.should_fence(self.deadline, time.monotonic()):
            # Too late: peers may already consider us dead. Never resurrect the lease.
            self._fence("no lease renewal succeeded within the deadline")
            return False
        try:
            ok = self._write(Match(self.token))
        except BucketError as err:
            log.warning("lease renewal failed: %s", err)
            return False
        if not ok:
            self._fence("lease renewal was rejected: another process took this node identity")
        return ok

    def expire(self) -> None:
        """Graceful stop: write the lease with ``expires_ms = 0`` so peers need not wait."""
        self._stopping.set()
        if self.token is None or self._fenced:
            return
        try:
            self._write(Match(self.token), expires_ms=0)
        except BucketError as err:
            log.warning("could not expire the lease: %s", err)

    def pause(self) -> None:
        """Test hook: a process frozen between its checks. It stops renewing and watching,
        and its deadline checks see no time pass, so only the acknowledgement rule's re-read
        can stop it (the window a real pause can hit between a check and an upload)."""
        self._paused.set()
        self.shared_deadline.value = float("inf")

    def _fence(self, reason: str) -> None:
        if self._fenced:
            return
        self._fenced = True
        self._stopping.set()
        self.on_fence(reason)

    def _start_watchdog(self) -> None:
        if self._watchdog is not None:
            return
        me = self.actor_ref
        interval = lease_rules.renew_interval(self.ttl)

        def watch() -> None:
            next_renew = time.monotonic() + interval
            while not self._stopping.wait(0.05):
                if self._paused.is_set():
                    continue
                mono = time.monotonic()
                if lease_rules.should_fence(self.deadline, mono):
                    self._fence(
                        f"no lease renewal succeeded within the deadline (TTL {self.ttl:g}s)"
                    )
                    return
                if mono >= next_renew:
                    next_renew = mono + interval
                    try:
                        me.proxy().renew()  # fire and forget; the deadline watches the result
                    except pykka.ActorDeadError:
                        return

        self._watchdog = threading.Thread(
            target=watch, name=f"lease-{self.store.node}", daemon=True
        )
        self._watchdog.start()

    def on_stop(self) -> None:
        self._stopping.set()
