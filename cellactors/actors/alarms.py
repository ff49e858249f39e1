"""The alarm driver of one node: wake entries of its cells, their timer heap, and the scan.

- **Mirrors.** For every cell hosted here (active or hibernated) the driver knows the wake
  entries that exist for it in the bucket. At activation it writes the entries the
  restored state needs; a transaction that changed the alarm or the outbox writes the new
  ones before its batch is uploaded (:meth:`CellSink.before_upload`: a batch that never
  lands leaves a stale entry, one spurious wake; a durable alarm never lacks its entry)
  and deletes the old ones once it is acknowledged (:meth:`CellSink.after_ack`). A release
  forgets the mirror and leaves the entries in the bucket, for whichever node wakes the cell
  next.
- **Timer heap.** The alarms of hosted cells fire from :class:`~cellactors.core.alarms.
  Schedule`, precisely, whether the cell is active or hibernated.
- **Scan.** At start and every ``alarm_scan_interval`` the driver lists the due entries
  (one LIST when nothing is due). It also scans when an entry of a cell that this node
  released falls due (at most one such scan a second), so that a released cell's alarm
  fires within a second of its time whatever the interval (only the cells of a node that
  died wait for some node's next scan). An entry of a cell hosted nowhere is an orphan: the
  driver activates the cell here through the ownership path, which refuses when a live
  node owns it; so exactly one node runs it. A due entry that the hosting node's state no
  longer needs is deleted (after a fresh read of ``own.json`` proves it still owns the cell).

Decisions come from :mod:`cellactors.core.alarms`; this module performs them.
"""

from __future__ import annotations

import concurrent.futures
import heapq
import logging
import threading
import time
from collections.abc import Callable, Container
from dataclasses import dataclass, field
from typing import Any, Protocol

from cellactors.actors.metrics import NodeMetrics
from cellactors.actors.ownership import Active
from cellactors.clock import RuntimeClock
from cellactors.core import alarms
from cellactors.core.alarms import Action, Wake, WakeState
from cellactors.errors import BucketError, CallError, NodeUnavailable, StaleRoute
from cellactors.persistence.control.ownership import OwnershipStore
from cellactors.persistence.control.wakes import WakeStore
from cellactors.persistence.store.bucket import Bucket
from cellactors.tracing import spans

#: The least time between two scans that departed entries (alarms of cells this node
#: released) start: an alarm of such a cell fires within this of its time.
DEPARTED_SCAN_GAP_S = 1.0


class Kicks(Protocol):
    """Something that delivers a cell's pending messages when kicked (the outbox)."""

    def kick(self, cell_id: str) -> None: ...


class AlarmHost(Protocol):
    """What the alarm driver needs of its node (the node is one): who it is, whether it
    serves, its clock, store and metrics, and how to activate a cell and fire its alarm."""

    @property
    def node_id(self) -> str: ...
    @property
    def status(self) -> str: ...
    @property
    def classes(self) -> Container[str]: ...
    @property
    def clock(self) -> RuntimeClock: ...
    @property
    def gate(self) -> Bucket: ...
    @property
    def metrics(self) -> NodeMetrics: ...
    @property
    def ownership(self) -> OwnershipStore: ...
    @property
    def outbox(self) -> Kicks: ...
    def may_send(self) -> bool: ...
    def routed_elsewhere(self, cell_id: str) -> bool: ...
    def activate_here(self, cell_id: str) -> Active: ...
    def fire_alarm(self, cell_id: str) -> Any: ...


log = logging.getLogger(__name__)

#: A fire that could not run (activation failed, the call timed out) is tried again after.
FIRE_RETRY_S = 1.0


@dataclass
class Mirror:
    """The wake entries that exist for one hosted cell, written by its activation at
    ``epoch``; the lock orders writes, deletes and stale checks of that cell."""

    epoch: int
    wakes: frozenset[Wake] = frozenset()
    lock: threading.Lock = field(default_factory=threading.Lock)


class CellSink:
    """The replicator's hooks for one activation (see
    :class:`~cellactors.actors.replicator.EffectSink`)."""

    def __init__(self, driver: AlarmDriver, cell_id: str, epoch: int) -> None:
        self.driver = driver
        self.cell_id = cell_id
        self.epoch = epoch
        self._remove: frozenset[Wake] = frozenset()

    def before_upload(self, effects: list[Any]) -> None:
        state: WakeState = effects[-1]
        mirror = self.driver.mirror_for(self.cell_id, self.epoch)
        with mirror.lock:
            add, remove = alarms.wake_changes(mirror.wakes, state)
            for wake in sorted(add):
                self.driver.store.put(self.cell_id, wake)
            mirror.wakes = alarms.wake_keys(state)
            self._remove = remove
        self.driver.schedule(self.cell_id, state.alarm)

    def after_ack(self, effects: list[Any]) -> None:
        state: WakeState = effects[-1]
        remove, self._remove = self._remove, frozenset()
        for wake in sorted(remove):
            if not self.driver.node.may_send():
                break
            try:
                self.driver.store.delete(self.cell_id, wake)
            except BucketError as err:  # a stale entry costs one spurious wake later
                log.info("wake entry of %s not deleted: %s", self.cell_id, err)
        if state.outbox:
            self.driver.node.outbox.kick(self.cell_id)


class AlarmDriver:
    """Mirrors, timer heap and scans of one node (one thread, plus a small pool for fires
    and orphan activations so a slow cell never delays another's alarm)."""

    def __init__(self, node: AlarmHost, interval: float) -> None:
        self.node = node
        self.store = WakeStore(node.gate)
        self.interval = interval
        self._mirrors: dict[str, Mirror] = {}
        self._schedule = alarms.Schedule()
        self._busy: set[str] = set()  # cells with a fire or an orphan wake in progress
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=8, thread_name_prefix=f"alarms-{node.node_id}"
        )
        self._thread = threading.Thread(
            target=self._loop, name=f"alarms-{node.node_id}", daemon=True
        )
        self.scans = 0  # scans started (each one LIST, plus one per further page)
        self._scan_now = False
        self._scanning = False  # a scan runs (its orphans are marked busy before it ends)
        self._departed: list[int] = []  # heap: due times of entries of cells released here

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
            self._mirrors.clear()
            self._schedule = alarms.Schedule()
        self._pool.shutdown(wait=False, cancel_futures=True)

    # --- mirrors ------------------------------------------------------------------------

    def sink(self, cell_id: str, epoch: int) -> CellSink:
        return CellSink(self, cell_id, epoch)

    def mirror_for(self, cell_id: str, epoch: int) -> Mirror:
        with self._cond:
            mirror = self._mirrors.get(cell_id)
            if mirror is None or mirror.epoch != epoch:
                mirror = self._mirrors[cell_id] = Mirror(epoch)
            return mirror

    def hosted(self, cell_id: str) -> frozenset[Wake] | None:
        with self._cond:
            mirror = self._mirrors.get(cell_id)
            return None if mirror is None else mirror.wakes

    def activated(self, cell_id: str, epoch: int, state: WakeState, resumed: bool) -> None:
        """A cell opened here: write the entries its restored state needs (they may be
        missing: a crash between an acknowledgement and the entry's write), unless it was
        resumed from hibernation (its entries are known), then schedule its alarm."""
        with self._cond:
            known = self._mirrors.get(cell_id)
        if not (resumed and known is not None and known.epoch == epoch):
            mirror = self.mirror_for(cell_id, epoch)
            with mirror.lock:
                wanted = alarms.wake_keys(state)
                for wake in sorted(wanted - mirror.wakes):
                    self.store.put(cell_id, wake)
                mirror.wakes = wanted
        self.schedule(cell_id, state.alarm)

    def released(self, cell_id: str) -> None:
        """The cell left this node (released, reset, fenced): forget it; its entries stay
        in the bucket for the next node that activates it, and this node scans when the
        first of them falls due (whichever node is then first activates the cell)."""
        with self._cond:
            mirror = self._mirrors.pop(cell_id, None)
            self._schedule.set(cell_id, None)
            if mirror is not None and mirror.wakes:
                heapq.heappush(self._departed, min(w.at_ms for w in mirror.wakes))
                self._cond.notify_all()

    def schedule(self, cell_id: str, alarm: Wake | None, at_ms: int | None = None) -> None:
        with self._cond:
            if alarm is None or cell_id in self._mirrors:
                self._schedule.set(cell_id, alarm, at_ms)
            self._cond.notify_all()

    def poke(self) -> None:
        """Re-evaluate the timer heap and scan now (the runtime's clock moved: a test fleet
        advanced alarm time)."""
        with self._cond:
            self._scan_now = True
            self._cond.notify_all()

    def scheduled(self, cell_id: str) -> Wake | None:
        with self._cond:
            return self._schedule.get(cell_id)

    def pending(self) -> list[str]:
        """What this node still has to do about alarms due by its clock now: a scan asked
        for or running, alarms firing or orphans waking, alarms due in the timer heap.
        Empty when idle (a test fleet waits for that: ``Fleet.advance_alarms``)."""
        with self._cond:
            found = []
            if self._scan_now or self._scanning:
                found.append("a scan of due wake entries")
            found += [f"the alarm of {cell_id}" for cell_id in sorted(self._busy)]
            at = self._schedule.next_at()
            if at is not None and at <= self.node.clock.now_ms():
                found.append("an alarm due in the timer heap")
            return found

    # --- the loop -----------------------------------------------------------------------

    def _loop(self) -> None:
        next_scan = 0.0
        last_scan = float("-inf")
        while not self._stop.is_set():
            now = time.monotonic()
            with self._cond:
                scan_now, self._scan_now = self._scan_now, False
                now_ms = self.node.clock.now_ms()
                departed_due = bool(self._departed) and self._departed[0] <= now_ms
                # However many cells this node released, their alarms cost at most one LIST
                # per DEPARTED_SCAN_GAP_S; and any scan covers every departed entry due by
                # then, whatever started it.
                scan = (
                    now >= next_scan
                    or scan_now
                    or (departed_due and now - last_scan >= DEPARTED_SCAN_GAP_S)
                )
                if scan:
                    self._scanning = True
                    while self._departed and self._departed[0] <= now_ms:
                        heapq.heappop(self._departed)
            if scan:
                next_scan = now + self.interval
                last_scan = now
                try:
                    self._scan()
                finally:
                    with self._cond:
                        self._scanning = False
            with self._cond:
                due = self._schedule.pop_due(self.node.clock.now_ms())
                for cell_id, _wake in due:
                    self._busy.add(cell_id)
            for cell_id, wake in due:
                self._submit(self._fire, cell_id, wake)
            with self._cond:
                if self._stop.is_set():
                    return
                wait = next_scan - time.monotonic()
                at = self._schedule.next_at()
                if at is not None:
                    wait = min(wait, (at - self.node.clock.now_ms()) / 1000)
                if self._departed:
                    due_in = (self._departed[0] - self.node.clock.now_ms()) / 1000
                    spaced = last_scan + DEPARTED_SCAN_GAP_S - time.monotonic()
                    wait = min(wait, max(due_in, spaced))
                if wait > 0:
                    self._cond.wait(wait)

    def _submit(self, fn: Callable[[str, Wake], None], cell_id: str, wake: Wake) -> None:
        try:
            self._pool.submit(fn, cell_id, wake)
        except RuntimeError:  # stopped
            with self._cond:
                self._busy.discard(cell_id)

    def _scan(self) -> None:
        """One scan of the due entries: at most one LIST per page, nothing else unless an
        entry is due."""
        node = self.node
        if node.status != "serving" or not node.may_send():
            return
        self.scans += 1
        node.metrics.wake_scans.inc()
        now = self.node.clock.now_ms()
        try:
            entries = list(self.store.due(now))
        except BucketError as err:
            log.warning("scan of due wake entries failed: %s", err)
            return
        for cell_id, wake in entries:
            action = alarms.scan_action(
                wake,
                now,
                self.hosted(cell_id),
                node.routed_elsewhere(cell_id),
                cell_id.split(":", 1)[0] in node.classes,
            )
            if action is Action.LOCAL:
                if wake.nonce == alarms.OUTBOX_TAG:
                    node.outbox.kick(cell_id)
                elif self.scheduled(cell_id) != wake:
                    self.schedule(cell_id, wake)
            elif action in (Action.DROP, Action.ACTIVATE):
                with self._cond:
                    if cell_id in self._busy:
                        continue
                    self._busy.add(cell_id)
                work = self._orphan if action is Action.ACTIVATE else self._stale
                self._submit(work, cell_id, wake)

    def _orphan(self, cell_id: str, wake: Wake) -> None:
        """Activate a cell whose entry is due and which no node hosts (its activation
        schedules its alarm and wakes its outbox), then drop the entry if stale."""
        try:
            self.node.activate_here(cell_id)
        except (StaleRoute, NodeUnavailable):
            pass  # a live node owns it (it fires there), or this node is stopping
        except CallError as err:
            log.info("orphan wake of %s not run: %s", cell_id, err)
        except Exception:
            log.exception("orphan wake of %s failed", cell_id)
        else:
            self._check_stale(cell_id, wake)
        finally:
            with self._cond:
                self._busy.discard(cell_id)

    def _stale(self, cell_id: str, wake: Wake) -> None:
        try:
            self._check_stale(cell_id, wake)
        except Exception:
            log.exception("stale wake entry check of %s failed", cell_id)
        finally:
            with self._cond:
                self._busy.discard(cell_id)

    def _check_stale(self, cell_id: str, wake: Wake) -> None:
        """Delete ``wake`` if the hosting activation's state does not need it, after a
        fresh read of ``own.json`` shows this activation still owns the cell."""
        with self._cond:
            mirror = self._mirrors.get(cell_id)
        if mirror is None:
            return
        with mirror.lock:
            if wake in mirror.wakes:
                return
            record = self.node.ownership.read_owner(cell_id)
            if record is None or (record.node, record.epoch) != (self.node.node_id, mirror.epoch):
                return
            log.info("deleting stale wake entry of %s at %d", cell_id, wake.at_ms)
            self.store.delete(cell_id, wake)

    def _fire(self, cell_id: str, wake: Wake) -> None:
        """Run the cell's due alarm here (waking it from hibernation if need be)."""
        retry: int | None = None
        try:
            with spans.span("cellactors.alarm", cell=cell_id, alarm_at_ms=wake.at_ms) as span:
                result = self.node.fire_alarm(cell_id)
                span.set("cellactors.alarm.result", result)
                span.outcome(None)
            if result in ("fired", "retry", "abandoned"):
                self.node.metrics.alarms.labels(cell_id.split(":", 1)[0], result).inc()
            if result == "abandoned":
                log.error("alarm of %s abandoned after its last allowed failure", cell_id)
            elif result == "not_due":
                retry = max(wake.at_ms, self.node.clock.now_ms() + 10)
        except StaleRoute:
            pass  # another live node owns the cell now
        except NodeUnavailable:
            return
        except Exception as err:
            log.info("alarm of %s not run yet: %s", cell_id, err)
            retry = self.node.clock.now_ms() + int(FIRE_RETRY_S * 1000)
        finally:
            with self._cond:
                self._busy.discard(cell_id)
        if retry is not None and self.scheduled(cell_id) == wake:
            self.schedule(cell_id, wake, retry)


__all__ = ["AlarmDriver", "CellSink", "Mirror"]
