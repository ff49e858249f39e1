"""The lease actor: holds this node's identity in ``nodes/<node>.json``.

It takes the identity at start (waiting, with a log line, while another live process holds
it), renews every TTL/3 with If-Match, and fences the node when a renewal is rejected or
none has succeeded by the deadline. The deadline is checked by a watchdog thread on the
monotonic clock, so a renewal stuck in a slow request cannot postpone the fence.
"""

from __future__ import annotations

import datetime
import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import pykka

from cellactors.core import lease_rules
from cellactors.errors import BucketError, ConfigError
from cellactors.persistence.bucket import Applied, CasResult, Guard, Match
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


class ClockSkew(ConfigError):
    """This machine's clock is off from the store's by more than the allowed bound."""


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
        max_skew_s: float | None = None,
        on_renewed: Callable[[], None] | None = None,
    ) -> None:
        super().__init__()
        self.on_renewed = on_renewed  # after each confirmed lease write (metrics)
        self.shared_deadline = shared_deadline or FenceDeadline()
        self.store = store
        self.generation = generation
        self.addr = addr
        self.load = load
        self.on_fence = on_fence
        self.ttl = store.ttl_s
        self.max_skew_ms = int(1000 * (self.ttl / 4 if max_skew_s is None else max_skew_s))
        self.token: str | None = None
        self.guard: Guard | None = None  # of the next renewal
        self.expires_ms = 0
        self.deadline = 0.0
        self.renewals = 0
        self.failures = 0  # consecutive failed attempts (backoff)
        self.next_attempt = float("inf")  # monotonic time of the next renewal
        self.clock_offset_ms: tuple[int, int] | None = None  # last measured bounds
        self._attempts: dict[int, float] = {}  # expires_ms -> sent (monotonic), unconfirmed
        self._stopping = threading.Event()
        self._renewing = threading.Event()
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
        """Take our identity; blocks while another live process holds it, and backs off
        (capped, with jitter) while the store fails. Returns the expiry. Raises
        :class:`ClockSkew` when this machine's clock is off from the store's."""
        started = time.monotonic()
        announced = False
        while not self._stopping.is_set():
            if give_up_after is not None and time.monotonic() - started > give_up_after:
                raise BucketError(f"could not take node id {self.store.node} in time")
            try:
                current = self.store.read_lease(self.store.node)
            except BucketError as err:
                self._back_off(f"reading the lease failed: {err}")
                continue
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
                wait = max(0.05, min(1.0, (decision.expires_ms - now_ms()) / 1000 + 0.05))
                self._stopping.wait(wait)
                continue
            if self._attempt(decision.guard, starting=True):
                self._start_watchdog()
                return self.expires_ms
            self._back_off("the lease write did not apply")
        raise BucketError("lease actor stopped while taking the identity")

    def _back_off(self, why: str) -> None:
        self.failures += 1
        delay = lease_rules.retry_delay(self.failures, 2.0, random.random())
        log.info("taking the lease: %s; next try in %.2fs", why, delay)
        self._stopping.wait(delay)

    def _attempt(
        self, guard: Guard, *, starting: bool = False, expires_ms: int | None = None
    ) -> bool:
        """One lease write, reconciled by reading the record back when it did not plainly
        apply. True when a write of ours is now the record (and the deadline moved)."""
        sent = time.monotonic()
        sent_ms = now_ms()
        expires = sent_ms + int(self.ttl * 1000) if expires_ms is None else expires_ms
        self._attempts[expires] = sent
        try:
            result: CasResult | None = self.store.cas_node_lease(guard, self._record(expires))
        except BucketError as err:  # ambiguous (5xx, timeout, reset) or a refused request
            log.warning("lease write of %s failed: %s", self.store.node, err)
            result = None
        received_ms = now_ms()
        if isinstance(result, Applied):
            self._check_clock(sent_ms, received_ms, result, starting)
            self._confirm(result.token, sent, expires)
            return True
        try:
            # One request: the renewal retries on its own schedule, within the deadline.
            current = self.store.read_lease(self.store.node, once=True)
        except BucketError as err:
            log.warning("reading back the lease of %s failed: %s", self.store.node, err)
            return False
        decision = lease_rules.reconcile(current, self.generation, self._attempts)
        if isinstance(decision, lease_rules.Fence):
            if not starting:
                self._fence(f"lease renewal was rejected: {decision.reason}")
            return False
        if isinstance(decision, lease_rules.Write):
            self.guard = decision.guard
            return False
        self.guard = Match(decision.token)
        if decision.sent_mono is None:
            return False  # an older write of ours: retry at once with the fresh token
        assert current is not None
        self._confirm(decision.token, decision.sent_mono, current.lease.expires_ms)
        return True

    def _confirm(self, token: str, sent_mono: float, expires_ms: int) -> None:
        self.token = token
        self.guard = Match(token)
        self.expires_ms = expires_ms
        self._attempts.clear()
        self.failures = 0
        self.deadline = max(self.deadline, lease_rules.fence_deadline(sent_mono, self.ttl))
        if not self._paused.is_set():
            self.shared_deadline.value = self.deadline
        self.renewals += 1
        if self.on_renewed is not None:
            self.on_renewed()

    def _check_clock(self, sent_ms: int, received_ms: int, result: Applied, starting: bool) -> None:
        if result.server_ms is None:
            return
        bounds = lease_rules.clock_offset_ms(
            sent_ms, received_ms, result.server_ms, result.server_resolution_ms
        )
        self.clock_offset_ms = bounds
        excess = lease_rules.clock_excess_ms(bounds, self.max_skew_ms)
        if excess is None:
            return
        message = (
            f"this machine's clock is at least {abs(excess) / 1000:.1f}s "
            f"{'ahead of' if excess > 0 else 'behind'} the store's (local "
            f"{_iso(received_ms)}, store {_iso(result.server_ms)}), beyond the allowed "
            f"{self.max_skew_ms / 1000:g}s (--max-clock-skew): lease expiries would be "
            "misjudged; fix the clock (NTP)"
        )
        log.error("%s", message)
        if starting:
            raise ClockSkew(message)
        self._fence(message)

    def renew(self) -> bool:
        """One renewal. Transient failures are retried with backoff until the fence
        deadline; only a record naming another process generation fences early."""
        try:
            return self._renew()
        finally:
            self._renewing.clear()

    def _renew(self) -> bool:
        if self._fenced or self.guard is None or self._stopping.is_set():
            return False
        if lease_rules.should_fence(self.deadline, time.monotonic()):
            # Too late: peers may already consider us dead. Never resurrect the lease.
            self._fence("no lease renewal succeeded within the deadline")
            return False
        ok = self._attempt(self.guard)
        interval = lease_rules.renew_interval(self.ttl)
        if ok:
            self.next_attempt = time.monotonic() + interval
        elif not self._fenced:
            self.failures += 1
            now = time.monotonic()
            delay = lease_rules.retry_delay(self.failures, interval / 2, random.random())
            # Several more tries must fit before the deadline, however the backoff grew.
            delay = min(delay, max(0.02, (self.deadline - now) / 4))
            self.next_attempt = now + delay
        return ok

    def expire(self) -> None:
        """Graceful stop: write the lease with ``expires_ms = 0`` so peers need not wait."""
        self._stopping.set()
        if self.guard is None or self._fenced:
            return
        try:
            self._attempt(self.guard, expires_ms=0)
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
        self.next_attempt = time.monotonic() + lease_rules.renew_interval(self.ttl)

        def watch() -> None:
            while not self._stopping.wait(0.05):
                if self._paused.is_set():
                    continue
                mono = time.monotonic()
                if lease_rules.should_fence(self.deadline, mono):
                    self._fence(
                        f"no lease renewal succeeded within the deadline (TTL {self.ttl:g}s)"
                    )
                    return
                if mono >= self.next_attempt and not self._renewing.is_set():
                    self._renewing.set()  # one renewal at a time; the deadline watches it
                    try:
                        me.proxy().renew()
                    except pykka.ActorDeadError:
                        return

        self._watchdog = threading.Thread(
            target=watch, name=f"lease-{self.store.node}", daemon=True
        )
        self._watchdog.start()

    def on_stop(self) -> None:
        self._stopping.set()


def _iso(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc).isoformat(
        timespec="milliseconds"
    )
