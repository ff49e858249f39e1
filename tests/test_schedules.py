"""Named schedules on in-process nodes against a real SeaweedFS: set, list, cancel, fire
and re-arm in the transaction of the call or run that does it; a rolled-back call sets
nothing; a failing run backs off like an alarm; a takeover fires what the old owner set;
and one wake entry per cell however many schedules it has (counted requests)."""

from __future__ import annotations

import functools
import itertools
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from cellactors import Node, NodeSettings
from cellactors.errors import MethodFailed
from cellactors.persistence.store.bucket import Bucket
from cellactors.persistence.store.s3 import S3Bucket
from cellactors.testing import Fleet
from tests.helpers.alarms import SCAN, owner, wakes
from tests.helpers.buckets import CuttableBucket
from tests.helpers.runtime import TTL, crash, eventually
from tests.helpers.schedule_cells import ATTEMPTS, FAILS, Planner


def planner_node(bucket: Bucket, node_id: str, **kw: Any) -> Node:
    kw.setdefault("alarm_scan_interval", SCAN)
    settings = NodeSettings(lease_ttl=TTL, advertise=f"127.0.0.1:1{len(node_id)}", **kw)
    return Node(bucket, node_id, [Planner], settings).start()


def delta(node: Node, before: Counter[tuple[str, str]]) -> dict[tuple[str, str], int]:
    """The node's bucket requests since ``before``, but for its lease renewals."""
    after = node.bucket.snapshot()
    return {k: after[k] - before[k] for k in after if after[k] != before[k] and k[1] != "lease"}


def names(cell: Any) -> list[str]:
    return [s["name"] for s in cell.listing()]


def test_set_list_and_cancel_schedules(sw_bucket: S3Bucket) -> None:
    node = planner_node(sw_bucket, "n1", alarm_scan_interval=60)
    try:
        cell = node.cell(Planner, "a")
        once = cell.plan(name="once", after=500, payload={"to": "ada"})
        now = once - 500  # the runtime's time of the call
        cell.plan(name="tick", every=300)
        cell.plan(name="weekly", cron="0 9 * * MON", tz="Europe/Paris", payload=[1, 2])
        cell.arm(delay=400)
        listing = cell.listing()
        assert [s["name"] for s in listing] == ["tick", "@alarm", "once", "weekly"]
        by_name = {s["name"]: s for s in listing}
        assert by_name["once"]["kind"] == "at" and by_name["once"]["payload"] == {"to": "ada"}
        assert by_name["once"]["due"] == pytest.approx(once, abs=0.001)
        assert by_name["tick"]["kind"] == "every" and by_name["tick"]["every"] == 300
        assert now + 299 < by_name["tick"]["due"] < now + 310
        assert by_name["weekly"]["kind"] == "cron" and by_name["weekly"]["tz"] == "Europe/Paris"
        assert by_name["weekly"]["cron"] == "0 9 * * MON" and by_name["weekly"]["payload"] == [1, 2]
        assert by_name["@alarm"]["kind"] == "at"
        # One wake entry, for the first to run.
        eventually(
            lambda: [at for _c, at in wakes(sw_bucket)] == [int(by_name["tick"]["due"] * 1000)]
        )
        assert cell.drop(name="tick") is True
        assert cell.drop(name="tick") is False
        assert cell.drop(name="@alarm") is True
        assert names(cell) == ["once", "weekly"]
        eventually(lambda: [at for _c, at in wakes(sw_bucket)] == [int(once * 1000)])
        with pytest.raises(MethodFailed, match="'@'"):
            cell.plan(name="@alarm", after=1)
        with pytest.raises(MethodFailed, match="JSON"):
            cell.plan(name="x", after=1, payload={"not json": float("nan")})
    finally:
        node.stop()


def test_a_rolled_back_call_sets_nothing(sw_bucket: S3Bucket) -> None:
    node = planner_node(sw_bucket, "n1")
    try:
        cell = node.cell(Planner, "a")
        with pytest.raises(MethodFailed, match="rolled back"):
            cell.plan_and_fail(name="never", after=0.1)
        assert cell.listing() == []
        assert wakes(sw_bucket) == []
        assert cell.runs() == []
    finally:
        node.stop()


def test_a_one_shot_fires_once_with_its_payload_then_is_gone(sw_bucket: S3Bucket) -> None:
    node = planner_node(sw_bucket, "n1")
    try:
        cell = node.cell(Planner, "a")
        at = cell.plan(name="hello", after=0.3, payload={"n": 1})
        cell.plan(name="later", after=3600)
        runs = eventually(lambda: cell.runs() or False, timeout=10)
        assert isinstance(runs, list)
        assert [r[:2] for r in runs] == [["hello", {"n": 1}]] and runs[0][2] >= at
        assert names(cell) == ["later"]
        later = cell.listing()[0]["due"]
        eventually(lambda: [a for _c, a in wakes(sw_bucket)] == [int(later * 1000)], timeout=5)
        eventually(lambda: node.metrics.alarms.labels("Planner", "fired")._value.get() == 1)
        assert [r[0] for r in cell.runs()] == ["hello"]  # never again
    finally:
        node.stop()


def test_every_is_re_armed_on_its_grid_in_the_run_s_transaction(sw_bucket: S3Bucket) -> None:
    node = planner_node(sw_bucket, "n1")
    try:
        cell = node.cell(Planner, "a")
        first = cell.plan(name="tick", every=0.25, payload="p")
        eventually(lambda: len(cell.runs()) >= 4, timeout=20)
        cell.drop(name="tick")
        runs = cell.runs()
        assert {r[0] for r in runs} == {"tick"} and {r[1] for r in runs} == {"p"}
        # Each run at or after its grid time first + k * 0.25, each k at most once.
        slots = [round((r[2] - first) / 0.25, 6) for r in runs]
        assert all(b > a for a, b in itertools.pairwise(r[2] for r in runs))
        assert all(s >= 0 for s in slots)
        eventually(lambda: wakes(sw_bucket) == [], timeout=5)
    finally:
        node.stop()


def test_alarm_and_schedules_share_one_wake_entry_and_all_fire(sw_bucket: S3Bucket) -> None:
    node = planner_node(sw_bucket, "n1")
    try:
        cell = node.cell(Planner, "a")
        cell.arm(delay=0.2)
        cell.plan_many(count=3, after=0.1)  # s00 at +0.1, s01 at +1.1, s02 at +2.1
        # The alarm's entry goes once the call that made s00 the first is acknowledged.
        eventually(lambda: len(wakes(sw_bucket)) == 1, timeout=5)
        eventually(lambda: len(cell.runs()) == 4, timeout=15)
        assert sorted(r[0] for r in cell.runs()) == ["@alarm", "s00", "s01", "s02"]
        assert cell.listing() == []
        eventually(lambda: wakes(sw_bucket) == [], timeout=5)
    finally:
        node.stop()


def test_a_failing_run_backs_off_and_then_commits_once(sw_bucket: S3Bucket) -> None:
    node = planner_node(sw_bucket, "n1")
    FAILS["a/flaky"] = 2
    try:
        cell = node.cell(Planner, "a")
        at = cell.plan(name="flaky", after=0.1, payload=7)
        runs = eventually(lambda: cell.runs() or False, timeout=15)
        assert isinstance(runs, list) and [r[:2] for r in runs] == [["flaky", 7]]
        assert runs[0][2] >= at + 0.2 + 0.4  # backoff 0.2 s, then 0.4 s
        # Two runs rolled back, the third durable (counted in the cell, not in metrics: a
        # fire whose answer comes late under load is counted by neither result).
        assert ATTEMPTS["a/flaky"] == 3
        assert cell.listing() == []
    finally:
        FAILS.pop("a/flaky", None)
        ATTEMPTS.pop("a/flaky", None)
        node.stop()


def test_a_recurring_schedule_given_up_moves_to_its_next_time(sw_bucket: S3Bucket) -> None:
    node = planner_node(sw_bucket, "n1")
    FAILS["a/daily"] = 3  # alarm_max_failures: the third failure gives this run up
    try:
        cell = node.cell(Planner, "a")
        first = cell.plan(name="daily", every=86400, after=0.1)
        metrics = node.metrics.alarms
        eventually(lambda: metrics.labels("Planner", "abandoned")._value.get() == 1, timeout=15)
        (listed,) = cell.listing()
        assert listed["due"] == pytest.approx(first + 86400, abs=0.001)
        assert listed["failures"] == 0 and cell.runs() == []
    finally:
        FAILS.pop("a/daily", None)
        node.stop()


def test_a_takeover_fires_a_schedule_set_on_the_old_owner(sw_bucket: S3Bucket) -> None:
    n1, n2 = planner_node(sw_bucket, "n1"), planner_node(sw_bucket, "n2")
    try:
        at = n1.cell(Planner, "a").plan(name="handover", after=1.5, payload="x")
        n1.cell(Planner, "a").plan(name="much-later", after=3600)
        crash(n1, sw_bucket)
        eventually(lambda: n2.metrics.alarms.labels("Planner", "fired")._value.get() == 1)
        runs = n2.cell(Planner, "a").runs()
        assert [r[:2] for r in runs] == [["handover", "x"]] and runs[0][2] >= at
        assert owner(sw_bucket, "Planner:a")[0] == "n2"
        assert names(n2.cell(Planner, "a")) == ["much-later"]
    finally:
        n1.stop()
        n2.stop()


def test_twenty_schedules_in_one_call_cost_one_wake_entry_like_one(sw_bucket: S3Bucket) -> None:
    node = planner_node(sw_bucket, "n1", alarm_scan_interval=60)
    try:
        one, many = node.cell(Planner, "one"), node.cell(Planner, "many")
        one.runs()
        many.runs()  # both activated (their tables created) before counting
        before = node.bucket.snapshot()
        one.plan_many(count=1, after=600)
        cost_one = delta(node, before)
        before = node.bucket.snapshot()
        many.plan_many(count=20, after=600)
        cost_many = delta(node, before)
        assert cost_one[("put", "wake")] == cost_many[("put", "wake")] == 1
        assert cost_one == cost_many  # batch, re-read, one wake entry: nothing grows
        # A schedule due after the first one costs no wake request at all.
        before = node.bucket.snapshot()
        many.plan(name="s99", after=7200)
        assert delta(node, before) == {("put", "batch"): 1, ("get", "own"): 1}
        assert len(many.listing()) == 21
        assert sorted(c for c, _at in wakes(sw_bucket)) == ["Planner:many", "Planner:one"]
    finally:
        node.stop()


def test_advancing_alarm_time_fires_schedules_an_hour_away(
    cellactors_fleet: Callable[..., Fleet],
) -> None:
    """``Fleet.advance_alarms`` fires a hosted cell's schedules and an orphan's (its owner
    killed); a recurring one runs once for the hour skipped and is re-armed after it."""
    fleet = cellactors_fleet([Planner], nodes=2)
    fleet.call(Planner, "hosted", "plan", name="report", after=3600, payload="h", via=0)
    fleet.call(Planner, "hosted", "plan", name="hourly", cron="0 * * * *", via=0)
    fleet.call(Planner, "orphan", "plan", name="report", after=3600, payload="o", via=1)
    fleet.kill(1)  # its cell is hosted nowhere now: only a scan finds the schedule
    assert fleet.call(Planner, "hosted", "runs", via=0) == []
    fleet.advance_alarms(3601)

    def ran(name: str, expected: list[str]) -> bool:
        runs = fleet.call(Planner, name, "runs", via=0)
        return sorted(r[0] for r in runs) == expected

    eventually(functools.partial(ran, "hosted", ["hourly", "report"]), timeout=10)
    eventually(functools.partial(ran, "orphan", ["report"]), timeout=10)
    assert fleet.owner(Planner, "orphan") == "node-0"
    (hourly,) = fleet.call(Planner, "hosted", "listing", via=0)
    now = fleet.call(Planner, "hosted", "plan", name="probe", after=0, via=0)
    assert hourly["name"] == "hourly" and now < hourly["due"] <= now + 3600


def test_a_run_whose_transaction_never_lands_runs_again_elsewhere_once(
    sw_bucket: S3Bucket,
) -> None:
    """The run and the schedule's consumption are one transaction: n1 runs it, commits in
    its file, but is cut from the store before the batch lands and dies; n2 takes over from
    the bucket, where the schedule is still unrun, and runs it: once durable in all."""
    store = CuttableBucket(sw_bucket)
    n1, n2 = planner_node(store, "n1"), planner_node(sw_bucket, "n2")
    try:
        n1.cell(Planner, "lost").plan(name="once", after=1.0, payload="p")
        store.cut = True  # from now on nothing n1 commits reaches the bucket
        eventually(lambda: ATTEMPTS["lost/once"] == 1, timeout=10)
        crash(n1, sw_bucket)
        eventually(lambda: n2.metrics.alarms.labels("Planner", "fired")._value.get() == 1)
        cell = n2.cell(Planner, "lost")
        assert [r[:2] for r in cell.runs()] == [["once", "p"]]
        assert ATTEMPTS["lost/once"] == 2 and cell.listing() == []
        assert owner(sw_bucket, "Planner:lost")[0] == "n2"
        eventually(lambda: wakes(sw_bucket) == [], timeout=5)
    finally:
        ATTEMPTS.pop("lost/once", None)
        n1.stop()
        n2.stop()


def test_a_released_cell_runs_its_schedules(sw_bucket: S3Bucket) -> None:
    node = planner_node(sw_bucket, "n1")
    try:
        at = node.cell(Planner, "a").plan(name="back", after=1.0)
        assert node.passivate("Planner:a")
        assert owner(sw_bucket, "Planner:a") == ("", 1)  # hosted nowhere
        eventually(lambda: owner(sw_bucket, "Planner:a") == ("n1", 2), timeout=15)
        runs = eventually(lambda: node.cell(Planner, "a").runs() or False, timeout=10)
        assert isinstance(runs, list) and [r[0] for r in runs] == ["back"] and runs[0][2] >= at
    finally:
        node.stop()


def test_a_hibernated_cell_runs_its_schedules_without_a_new_epoch(sw_bucket: S3Bucket) -> None:
    node = planner_node(sw_bucket, "n1", alarm_scan_interval=60)
    try:
        cell = node.cell(Planner, "a")
        cell.plan(name="tick", every=0.3)
        assert node.hibernate("Planner:a")
        eventually(lambda: node.metrics.alarms.labels("Planner", "fired")._value.get() >= 2)
        assert owner(sw_bucket, "Planner:a") == ("n1", 1)
        assert {r[0] for r in cell.runs()} == {"tick"}
    finally:
        node.stop()
