"""The lease actor: holds this node's identity in ``nodes/<node>.json``.

It takes the identity at start (waiting, with a log line, while another live process holds
it), renews every TTL/3 with If-Match, and fences the node when a renewal is rejected or
none has succeeded by the deadline. The deadline is checked by a watchdog thread on
:func:`cellactors.clock.mono`, so a renewal stuck in a slow request cannot postpone the
fence. Expiries are written in the store's time (:class:`cellactors.clock.StoreClock`), so
no node's wall clock decides when a lease lapses; the watchdog also notices a wall clock
that jumps (logged and counted: nothing depends on it) and the lease clock fences the node
when the store's own time jumps forward (see :class:`LeaseClock`).
"""

from __future__ import annotations

import datetime
import logging
import random
import threading
from collections.abc import Callable
from typing import Any

import pykka

from cellactors.clock import StoreClock, local_time, mono, wall_ms
from cellactors.core import lease_rules, store_clock
from cellactors.errors import BucketError, ClockSkew, ConfigError
from cellactors.persistence.control.leases import LeaseStore, NodeLease
from cellactors.persistence.store.bucket import Applied, CasResult, Guard, Match

log = logging.getLogger(__name__)


class FenceDeadline:
    """The monotonic time by which the next renewal must succeed, shared with the node so
    that every call can check it without a message (a resumed, long-paused process must not
    answer even a read before its watchdog runs)."""

    def __init__(self) -> None:
        self.value = float("inf")

    def passed(self) -> bool:
        return lease_rules.should_fence(self.value, mono())


class LeaseClock:
    """How this node judges leases: on the store's clock, and not at all for a while after
    the store's time jumped.

    A jump (an answer of the store that disagrees with what earlier answers and the
    monotonic clock predicted by more than half the fence margin) means the bounds that
    earlier decisions rested on were wrong. For one lease TTL after it, :meth:`judge` says
    nothing: a holder of a lease renews within that time and sees the jump itself (and
    fences when the store's time moved forward), so a takeover decided after it is decided
    on bounds both agree on. ``on_forward_jump`` is called for a forward jump (the node
    fences: peers may think its lease lapsed early)."""

    def __init__(
        self,
        store: StoreClock,
        ttl_s: float,
        on_forward_jump: Callable[[str], None] | None = None,
        on_jump: Callable[[], None] | None = None,
    ) -> None:
        self.store = store
        self.ttl_s = ttl_s
        self.tolerance_ms = store_clock.jump_tolerance_ms(lease_rules.fence_margin(ttl_s))
        self.on_forward_jump = on_forward_jump
        self.on_jump = on_jump  # metrics
        self._settle_until = float("-inf")
        self._unsubscribe = store.on_jump(self._jumped)

    def _jumped(self, ms: float) -> None:
        if abs(ms) <= self.tolerance_ms:
            return
        self._settle_until = mono() + self.ttl_s
        if self.on_jump is not None:
            self.on_jump()
        if ms > 0 and self.on_forward_jump is not None:
            self.on_forward_jump(
                f"the store's clock jumped {ms / 1000:+.3f}s against this machine's monotonic "
                f"clock (more than {self.tolerance_ms / 1000:.3g}s): peers may judge this "
                "node's lease expired early"
            )
        elif ms < 0:
            log.warning(
                "the store's clock jumped %.3fs back; lease expiries are not judged for %gs",
                ms / 1000,
                self.ttl_s,
            )

    def judge(self) -> int | None:
        """The store time that lease expiries are compared with now (surely reached), or
        None while the clock settles after a jump: then no lease may be taken as expired."""
        if mono() < self._settle_until:
            return None
        return self.store.low_ms()

    def close(self) -> None:
        self._unsubscribe()


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
        on_wall_jump: Callable[[], None] | None = None,
    ) -> None:
        super().__init__()
        self.on_renewed = on_renewed  # after each confirmed lease write (metrics)
        self.on_wall_jump = on_wall_jump  # metrics
        self.clock = store.bucket.clock
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
        self.clock_offset_ms: tuple[int, int] | None = None  # wall - store, last measured
        self._skewed = False  # the wall clock is off the store's (logged once per episode)
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
        started = mono()
        first: lease_rules.WaitForExpiry | None = None
        while not self._stopping.is_set():
            if give_up_after is not None and mono() - started > give_up_after:
                raise BucketError(f"could not take node id {self.store.node} in time")
            try:
                current = self.store.read_lease(self.store.node)
            except BucketError as err:
                self._back_off(f"reading the lease failed: {err}")
                continue
            decision = lease_rules.decide_start(current, self.generation, self.clock.low_ms())
            if isinstance(decision, lease_rules.WaitForExpiry):
                if first is None:
                    first = decision
                    log.warning(
                        "node id %s is held by another process (generation %s) whose lease "
                        "runs until %s, in %.1fs: waiting for it to expire (a crashed "
                        "process's lease does; a live one's is renewed, and then this start "
                        "gives up)",
                        self.store.node,
                        decision.holder_generation,
                        local_time(decision.expires_ms),
                        max(0, decision.expires_ms - self.clock.low_ms()) / 1000,
                    )
                elif lease_rules.holder_is_live(first, decision):
                    raise ConfigError(
                        f"node id {self.store.node} is in use: the process holding it "
                        f"(generation {decision.holder_generation}) is alive and renewed its "
                        "lease; stop it first, or start this one with another --node"
                    )
                left_ms = decision.expires_ms - self.clock.low_ms()
                wait = max(0.05, min(1.0, left_ms / 1000 + 0.05))
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
        sent = mono()
        expires = self.clock.expiry_ms(sent, self.ttl) if expires_ms is None else expires_ms
        self._attempts[expires] = sent
        try:
            result: CasResult | None = self.store.cas_node_lease(guard, self._record(expires))
        except BucketError as err:  # ambiguous (5xx, timeout, reset) or a refused request
            log.warning("lease write of %s failed: %s", self.store.node, err)
            result = None
        if isinstance(result, Applied):
            self._check_clock(starting)
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

    def _check_clock(self, starting: bool) -> None:
        """Compare this machine's wall clock with the store's. Beyond ``--max-clock-skew``
        at start the node refuses to start (its users' code and logs would read a wrong
        time); later it is logged once per episode, and nothing else: no decision of the
        protocol reads the wall clock."""
        bounds = self.clock.wall_offset_ms()
        if bounds is None:
            return
        self.clock_offset_ms = bounds
        excess = lease_rules.clock_excess_ms(bounds, self.max_skew_ms)
        if excess is None:
            if self._skewed:
                log.info("this machine's clock agrees with the store's again")
            self._skewed = False
            return
        store_now = self.clock.now_ms()
        message = (
            f"this machine's clock is at least {abs(excess) / 1000:.1f}s "
            f"{'ahead of' if excess > 0 else 'behind'} the store's (local "
            f"{_iso(wall_ms())}, store {_iso(store_now)}), beyond the allowed "
            f"{self.max_skew_ms / 1000:g}s (--max-clock-skew)"
        )
        if starting:
            log.error("%s; fix the clock (NTP)", message)
            raise ClockSkew(message + "; fix the clock (NTP)")
        if not self._skewed:
            log.warning(
                "%s; leases, takeovers and alarms follow the store's clock, but the cells' "
                "own code reads this machine's: fix the clock (NTP)",
                message,
            )
        self._skewed = True

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
        if lease_rules.should_fence(self.deadline, mono()):
            # Too late: peers may already consider us dead. Never resurrect the lease.
            self._fence("no lease renewal succeeded within the deadline")
            return False
        ok = self._attempt(self.guard)
        interval = lease_rules.renew_interval(self.ttl)
        if ok:
            self.next_attempt = mono() + interval
        elif not self._fenced:
            self.failures += 1
            now = mono()
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
        self.next_attempt = mono() + lease_rules.renew_interval(self.ttl)
        tolerance = store_clock.jump_tolerance_ms(lease_rules.fence_margin(self.ttl))
        last = (mono(), float(wall_ms()))

        def watch() -> None:
            nonlocal last
            while not self._stopping.wait(0.05):
                if self._paused.is_set():
                    continue
                now = mono()
                reading = (now, float(wall_ms()))
                jumped = store_clock.wall_jump_ms(last, reading, tolerance)
                last = reading
                if jumped is not None:
                    self._wall_jumped(jumped)
                if lease_rules.should_fence(self.deadline, now):
                    self._fence(
                        f"no lease renewal succeeded within the deadline (TTL {self.ttl:g}s)"
                    )
                    return
                if now >= self.next_attempt and not self._renewing.is_set():
                    self._renewing.set()  # one renewal at a time; the deadline watches it
                    try:
                        me.proxy().renew()
                    except pykka.ActorDeadError:
                        return

        self._watchdog = threading.Thread(
            target=watch, name=f"lease-{self.store.node}", daemon=True
        )
        self._watchdog.start()

    def _wall_jumped(self, ms: float) -> None:
        log.warning(
            "this machine's wall clock jumped %+.3fs; leases, takeovers and alarms follow the "
            "store's clock and are not affected",
            ms / 1000,
        )
        if self.on_wall_jump is not None:
            self.on_wall_jump()

    def on_stop(self) -> None:
        self._stopping.set()


def _iso(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc).isoformat(
        timespec="milliseconds"
    )
