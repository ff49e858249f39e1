"""Durable alarms on in-process nodes against a real SeaweedFS: wake entries written before
the batch that sets the alarm, deleted once consumed; alarms firing on active,
hibernated, released and orphaned cells; backoff and abandonment; an idle node's exact
request budget."""

from __future__ import annotations

import functools
import itertools
import math
import threading
import time
from collections import Counter
from typing import Any

import pytest

from cellactors import Node
from cellactors.actors.alarms import DEPARTED_SCAN_GAP_S
from cellactors.errors import MethodFailed, NotDurable
from cellactors.persistence.store.bucket import Bucket
from cellactors.persistence.store.s3 import S3Bucket
from tests.helpers.alarm_cells import Flaky, Reminder
from tests.helpers.alarms import SCAN, alarm_node, owner, wakes
from tests.helpers.buckets import CuttableBucket
from tests.helpers.runtime import crash, eventually


def fired_or_false(node: Node, name: str) -> list[float] | bool:
    """The times Reminder ``name`` fired at, or False while it has not (for eventually())."""
    fired: list[float] = node.cell(Reminder, name).fired()
    return fired or False


def owned_at(bucket: Bucket, cell_id: str, epoch: int) -> bool:
    return owner(bucket, cell_id)[1] == epoch


def delta(node: Node, before: Counter[tuple[str, str]]) -> dict[tuple[str, str], int]:
    """The node's bucket requests since ``before``, but for its lease renewals (they run on
    their own clock: a loaded machine can slow a call past one)."""
    after = node.bucket.snapshot()
    return {k: after[k] - before[k] for k in after if after[k] != before[k] and k[1] != "lease"}


def test_alarm_fires_and_its_wake_entry_lives_from_ack_to_consumption(
    sw_bucket: S3Bucket,
) -> None:
    node = alarm_node(sw_bucket, "n1", alarm_scan_interval=60)
    try:
        cell = node.cell(Reminder, "a")
        cell.fired()  # activated (its tables created) before counting
        before = node.bucket.snapshot()
        at = cell.remind(delay=1.0)
        # One batch, one re-read, and the wake entry, written before the answer.
        assert delta(node, before) == {("put", "batch"): 1, ("get", "own"): 1, ("put", "wake"): 1}
        assert wakes(sw_bucket) == [("Reminder:a", int(at * 1000))]
        assert cell.alarm() == pytest.approx(at, abs=0.001)
        assert cell.fired() == []
        fired = eventually(lambda: cell.fired() or False, timeout=10)
        assert isinstance(fired, list)  # eventually() returns only once it is no longer False
        assert len(fired) == 1 and at <= fired[0] < at + 2.0
        assert cell.alarm() is None
        eventually(lambda: wakes(sw_bucket) == [], timeout=5)  # consumed, then deleted
        # Counted by the alarm thread once the run's answer is back: a moment after its effects.
        eventually(lambda: node.metrics.alarms.labels("Reminder", "fired")._value.get() == 1)
    finally:
        node.stop()


def test_replacing_or_deleting_an_alarm_moves_its_wake_entry(sw_bucket: S3Bucket) -> None:
    node = alarm_node(sw_bucket, "n1")
    try:
        cell = node.cell(Reminder, "a")
        cell.remind(delay=100)
        at = cell.remind(delay=200)
        eventually(lambda: wakes(sw_bucket) == [("Reminder:a", int(at * 1000))], timeout=5)
        cell.cancel()
        eventually(lambda: wakes(sw_bucket) == [], timeout=5)
        assert cell.alarm() is None
    finally:
        node.stop()


def test_user_sql_may_read_but_not_write_the_runtime_tables(sw_bucket: S3Bucket) -> None:
    node = alarm_node(sw_bucket, "n1")
    try:
        cell = node.cell(Reminder, "a")
        cell.remind(delay=100)
        for statement in (
            "DELETE FROM _cellactors_alarm",
            "UPDATE _cellactors_alarm SET at_ms = 0",
            "DROP TABLE _cellactors_alarm",
            "CREATE TABLE _cellactors_outbox (x)",
        ):
            with pytest.raises(MethodFailed, match="runtime"):
                cell.sql(statement=statement)
        assert cell.alarm() is not None
    finally:
        node.stop()


def test_a_hibernated_cell_fires_on_time_without_a_new_epoch(sw_bucket: S3Bucket) -> None:
    node = alarm_node(sw_bucket, "n1", alarm_scan_interval=60)
    try:
        cell = node.cell(Reminder, "a")
        at = cell.remind(delay=1.0)
        assert node.hibernate("Reminder:a") and node.hibernated_cells() == 1
        eventually(lambda: node.metrics.alarms.labels("Reminder", "fired")._value.get() == 1)
        fired = cell.fired()
        assert isinstance(fired, list)  # eventually() returns only once it is no longer False
        assert len(fired) == 1 and at <= fired[0] < at + 1.5  # the timer heap, not a scan
        assert owner(sw_bucket, "Reminder:a") == ("n1", 1)
    finally:
        node.stop()


def test_a_released_cell_fires_from_a_scan_within_the_interval(sw_bucket: S3Bucket) -> None:
    n1, n2 = alarm_node(sw_bucket, "n1"), alarm_node(sw_bucket, "n2")
    try:
        at = n1.cell(Reminder, "a").remind(delay=1.0)
        assert n1.passivate("Reminder:a")
        assert owner(sw_bucket, "Reminder:a") == ("", 1)  # hosted nowhere
        node_of = {"n1": n1, "n2": n2}

        def fired_somewhere() -> list[float] | bool:
            name, epoch = owner(sw_bucket, "Reminder:a")
            if not name or epoch < 2:
                return False
            return node_of[name].cell(Reminder, "a").fired() or False

        fired = eventually(fired_somewhere, timeout=15)
        # The periodic scans (every 0.3 s) covered n1's departed entry: it is dropped, not
        # kept (and scanned for again) for as long as scans come more often than 1 s.
        eventually(lambda: not n1.alarms._departed, timeout=5)
        assert isinstance(fired, list)  # eventually() returns only once it is no longer False
        assert len(fired) == 1 and at <= fired[0] < at + SCAN + 1.5
        eventually(lambda: wakes(sw_bucket) == [], timeout=5)
    finally:
        n1.stop()
        n2.stop()


def test_a_released_cell_fires_on_time_whatever_the_scan_interval(sw_bucket: S3Bucket) -> None:
    # No periodic scan runs during the test (60 s): the node that released the cell scans
    # when its alarm falls due, and activates it.
    n1 = alarm_node(sw_bucket, "n1", alarm_scan_interval=60)
    try:
        eventually(lambda: n1.alarms.scans == 1)  # the scan at start
        at = n1.cell(Reminder, "a").remind(delay=1.0)
        assert n1.passivate("Reminder:a")
        assert owner(sw_bucket, "Reminder:a") == ("", 1)  # hosted nowhere
        eventually(lambda: owner(sw_bucket, "Reminder:a") == ("n1", 2), timeout=10)
        fired = eventually(lambda: n1.cell(Reminder, "a").fired() or False, timeout=5)
        assert isinstance(fired, list)  # eventually() returns only once it is no longer False
        assert len(fired) == 1 and at <= fired[0] < at + 1.5
        assert n1.alarms.scans == 2
        eventually(lambda: wakes(sw_bucket) == [], timeout=5)
    finally:
        n1.stop()


def test_released_cells_alarms_share_scans(sw_bucket: S3Bucket) -> None:
    # Five released cells whose alarms fall due 100 ms apart: not one LIST each, at most one
    # per DEPARTED_SCAN_GAP_S (1 s), each alarm still fired within that of its time.
    n1 = alarm_node(sw_bucket, "n1", alarm_scan_interval=60)
    names = [f"r{i}" for i in range(5)]
    try:
        eventually(lambda: n1.alarms.scans == 1)  # the scan at start
        due = {}
        for i, name in enumerate(names):
            due[name] = n1.cell(Reminder, name).remind(delay=1.0 + i / 10)
            assert n1.passivate(f"Reminder:{name}")
        for name in names:
            eventually(functools.partial(owned_at, sw_bucket, f"Reminder:{name}", 2), timeout=10)
            fired = eventually(functools.partial(fired_or_false, n1, name))
            assert isinstance(fired, list)  # eventually() returns only once it is no longer False
            assert len(fired) == 1 and due[name] <= fired[0] < due[name] + 2.5
        # The start's scan, then at most one per gap over the span of the due times (0.4 s
        # unless a loaded machine spread the five calls out): 3 in all, not 1 + 5.
        spread = max(due.values()) - min(due.values())
        assert 2 <= n1.alarms.scans <= 2 + math.ceil(spread / DEPARTED_SCAN_GAP_S)
    finally:
        n1.stop()


def test_an_alarm_of_a_crashed_owner_fires_once_on_another_node(sw_bucket: S3Bucket) -> None:
    n1, n2 = alarm_node(sw_bucket, "n1"), alarm_node(sw_bucket, "n2")
    try:
        at = n1.cell(Reminder, "a").remind(delay=1.5)
        crash(n1, sw_bucket)
        eventually(lambda: n2.metrics.alarms.labels("Reminder", "fired")._value.get() == 1)
        fired = n2.cell(Reminder, "a").fired()
        assert isinstance(fired, list)  # eventually() returns only once it is no longer False
        assert len(fired) == 1 and at <= fired[0] < at + SCAN + 2.0
        assert owner(sw_bucket, "Reminder:a")[0] == "n2"
        eventually(lambda: wakes(sw_bucket) == [], timeout=5)
    finally:
        n1.stop()
        n2.stop()


class CrashAfterBatch(CuttableBucket):
    """When ``armed``, the next batch PUT lands and then never answers, like a node killed
    right after its batch reached the store (the test fences the node meanwhile)."""

    def __init__(self, inner: S3Bucket) -> None:
        super().__init__(inner)
        self.armed = False
        self.landed = threading.Event()
        self.release = threading.Event()

    def put(self, key, body):  # type: ignore[no-untyped-def]
        result = self.inner.put(key, body)
        if self.armed and key.endswith(".batch"):
            self.armed = False
            self.landed.set()
            self.release.wait(30)
        return result


def test_an_alarm_durable_when_its_owner_died_has_its_wake_entry(sw_bucket: S3Bucket) -> None:
    """The wake entry is written before the batch: an owner killed the moment its batch
    landed (no answer, nothing after) leaves a durable alarm that still fires elsewhere."""
    store = CrashAfterBatch(sw_bucket)
    n1, n2 = alarm_node(store, "n1"), alarm_node(sw_bucket, "n2")
    answers: list[object] = []
    try:
        cell = n1.cell(Reminder, "a")
        cell.fired()  # activated first: the batch that lands is the one that sets the alarm
        store.armed = True
        caller = threading.Thread(target=lambda: answers.append(_outcome(cell, 1.0)))
        caller.start()
        assert store.landed.wait(10)
        assert [c for c, _at in wakes(sw_bucket)] == ["Reminder:a"]  # already there
        crash(n1, sw_bucket)
        store.release.set()
        caller.join(10)
        assert len(answers) == 1 and isinstance(answers[0], NotDurable)  # outcome unknown
        eventually(lambda: n2.metrics.alarms.labels("Reminder", "fired")._value.get() == 1)
        assert len(n2.cell(Reminder, "a").fired()) == 1
        assert owner(sw_bucket, "Reminder:a")[0] == "n2"
    finally:
        store.release.set()
        n1.stop()
        n2.stop()


def _outcome(cell: Any, delay: float) -> object:
    try:
        return cell.remind(delay=delay)
    except NotDurable as err:
        return err


def test_a_periodic_alarm_runs_on_one_node_of_three(sw_bucket: S3Bucket) -> None:
    nodes = [alarm_node(sw_bucket, f"n{i}") for i in range(3)]
    try:
        nodes[0].cell(Reminder, "a").remind(delay=0.2, every=0.2)
        eventually(lambda: len(nodes[0].cell(Reminder, "a").fired()) >= 8, timeout=20)
        nodes[0].cell(Reminder, "a").cancel()
        fired = nodes[0].cell(Reminder, "a").fired()
        gaps = [b - a for a, b in itertools.pairwise(fired)]
        assert min(gaps) >= 0.19  # never two runs of one alarm (each sets the next)
        runs = [n.metrics.alarms.labels("Reminder", "fired") for n in nodes]
        # Each run is counted once its answer is back, a moment after its effects.
        eventually(lambda: sum(r._value.get() for r in runs) == len(fired))
        assert runs[0]._value.get() == len(fired)
    finally:
        for n in nodes:
            n.stop()


def test_a_failing_alarm_backs_off_and_is_abandoned(sw_bucket: S3Bucket) -> None:
    node = alarm_node(sw_bucket, "n1")
    try:
        cell = node.cell(Flaky, "a")
        started = time.time()
        cell.arm(delay=0.1)
        runs = node.metrics.alarms
        eventually(lambda: runs.labels("Flaky", "abandoned")._value.get() == 1, timeout=15)
        elapsed = time.time() - started
        assert runs.labels("Flaky", "retry")._value.get() == 2  # failures 1 and 2 retried
        assert runs.labels("Flaky", "fired")._value.get() == 0
        assert elapsed >= 0.1 + 0.2 + 0.4  # backoff 0.2 s, then 0.4 s (the cap)
        assert cell.alarm() is None
        eventually(lambda: wakes(sw_bucket) == [], timeout=5)
    finally:
        node.stop()


def _counts(node: Node) -> tuple[int, float, Counter[tuple[str, str]]]:
    """(scans, lease renewals, requests sent) read consistently (nothing moved meanwhile)."""
    while True:
        scans, renewals = node.alarms.scans, node.metrics.lease_renewals._value.get()
        sent = node.bucket.snapshot()
        if (scans, renewals) == (node.alarms.scans, node.metrics.lease_renewals._value.get()):
            time.sleep(0.05)  # a request counted as sent finishes before we look again
            if sent == node.bucket.snapshot():
                return scans, renewals, sent


def test_an_idle_node_sends_lease_renewals_and_one_list_per_scan(sw_bucket: S3Bucket) -> None:
    node = alarm_node(sw_bucket, "n1", alarm_scan_interval=0.4)
    other = alarm_node(sw_bucket, "n2", alarm_scan_interval=60)
    try:
        other.cell(Reminder, "later").remind(delay=3600)  # a future entry: not due
        scans0, renewals0, sent0 = _counts(node)
        time.sleep(2.5)  # the interval being measured, not a synchronisation
        scans1, renewals1, sent1 = _counts(node)
        scans, renewals = scans1 - scans0, int(renewals1 - renewals0)
        # About 6 scans fit in 2.5 s; a loaded machine may stall the loop for a second or
        # two, so the floor only says the scan is periodic. The ceiling is the idle cost.
        assert 2 <= scans <= 8
        sent = {k: sent1[k] - sent0[k] for k in sent1 if sent1[k] != sent0[k]}
        expected = {("list", "wake"): scans, ("put_cas", "lease"): renewals}
        assert sent == {k: v for k, v in expected.items() if v}
    finally:
        node.stop()
        other.stop()
