"""Store faults under write load, each ending with the ledger checks: latency on every
request, a 503 throttle storm, a batch upload that hangs past the operation deadline, and
ambiguous commits (the store applies the write, the answer is lost)."""

from __future__ import annotations

import signal
import time
from collections import Counter

import pytest

from tests.faults.conftest import MakeFaultFleet
from tests.faults.harness import progress, warm
from tests.faults.ledger import UNKNOWN
from tests.faults.proxy import KINDS
from tests.helpers.fleet import wait_for

pytestmark = pytest.mark.faults

# The runtime's operation deadline for proving a write (NodeSettings.op_deadline).
OP_DEADLINE = 15.0


def test_storage_latency_on_every_request_slows_but_loses_nothing(
    make_fault_fleet: MakeFaultFleet,
) -> None:
    """150 ms on every store request of every node, from start-up on (probe, lease,
    ownership, batches, seals, restores): writes are slower, nobody fences, nothing is
    lost, and a takeover under latency works too."""
    fleet = make_fault_fleet(tag="slow", start=False)
    rules = [node.proxy.delay(0.15) for node in fleet]
    fleet.start(timeout=60)
    ledgers = warm(fleet, fleet[0], "slow0", "slow1")
    for i, ledger in enumerate(ledgers):
        ledger.writer(fleet.live_urls, f"w{i}", timeout=20)
    try:
        progress(ledgers, 0, 8, 40, "under latency")
        fleet[0].signal(signal.SIGKILL)
        fleet[0].wait(10)
        progress(ledgers, time.time(), 5, 40, "after a takeover under latency")
    finally:
        for ledger in ledgers:
            ledger.stop_writers()
    assert all(node.fence_time() is None for node in fleet)
    assert all(node.running for node in fleet.nodes[1:])
    delayed = Counter(r.kind for r in fleet.requests() if r.action == "delay")
    assert {"lease", "own", "batch", "seal", "list", "probe"} <= set(delayed), delayed
    assert set(delayed) <= KINDS
    assert sum(rule.applied for rule in rules) == sum(delayed.values())
    fleet.check(ledgers)


def test_throttle_storm_on_batch_puts_and_ownership_reads(
    make_fault_fleet: MakeFaultFleet,
) -> None:
    """30% of batch PUTs and of own.json GETs answer 503 SlowDown on the owner: the
    client's and the replicator's retries carry the writes through; whatever failed says
    so honestly and nothing acknowledged is lost."""
    fleet = make_fault_fleet(tag="throttle")
    owner = fleet[0]
    ledgers = warm(fleet, owner, "thr0", "thr1")
    storm = [
        owner.proxy.fail(503, kind="batch", method="PUT", probability=0.3, seed=11),
        owner.proxy.fail(503, kind="own", method="GET", probability=0.3, seed=12),
    ]
    for i, ledger in enumerate(ledgers):
        ledger.writer(fleet.live_urls, f"w{i}", timeout=35)
    try:
        progress(ledgers, 0, 15, 90, "through the storm")
        assert all(rule.applied > 0 for rule in storm), [r.applied for r in storm]
        for rule in storm:
            owner.proxy.remove(rule)
        progress(ledgers, time.time(), 3, 30, "after the storm")
    finally:
        for ledger in ledgers:
            ledger.stop_writers()
    assert all(node.fence_time() is None for node in fleet)
    fleet.check(ledgers)


def test_batch_upload_hanging_past_the_deadline_is_an_unknown_outcome(
    make_fault_fleet: MakeFaultFleet,
) -> None:
    """Every batch PUT of the cell hangs: after the operation deadline the caller gets an
    error whose outcome is ``unknown`` (never ``not_run``), the cell is reset, the next call
    runs at a higher epoch, and the hung write, landing late once the store answers again,
    lies beyond the old epoch's seal: it never shows up."""
    fleet = make_fault_fleet(size=2, tag="hang")
    owner = fleet[0]
    (ledger,) = warm(fleet, owner, "hang")
    before = fleet.epoch("hang")
    # Every upload into the current epoch hangs; the next activation's epoch is not touched.
    rule = owner.proxy.hang(kind="batch", method="PUT", key=f"Ledger:hang/e{before}/")
    started = time.monotonic()
    hung = ledger.append(owner.public_url, "hung", timeout=45)
    took = time.monotonic() - started
    assert not hung.acked and hung.outcome == UNKNOWN, hung
    assert OP_DEADLINE - 1 <= took < OP_DEADLINE + 10, took
    after = ledger.append(owner.public_url, "after")
    assert after.acked, after
    assert fleet.epoch("hang") > before  # restored and sealed the old epoch without it
    owner.proxy.remove(rule)
    released = time.time()
    rule.release()  # the hung requests are closed unanswered; the client's retry lands late
    landed = owner.proxy.wait_request(
        "of the hung batch landing late",
        lambda r: r.kind == "batch" and r.arrived >= released and r.applied,
        30,
    )
    assert f"/e{before}/" in landed.key
    entries = fleet.check([ledger])["hang"]
    assert "hung" not in entries and "after" in entries


def test_ambiguous_commits_of_batches_and_ownership_are_reconciled(
    make_fault_fleet: MakeFaultFleet,
) -> None:
    """The store applies the write and the answer is lost: batch PUTs on the owner, and
    own.json conditional PUTs on every node (claims at first activation, releases when the
    owner drains, takeovers by the peers). Acquires are confirmed by reading back, plain
    PUTs retried, and the ownership history stays one owner per epoch."""
    fleet = make_fault_fleet(tag="amb", lease_ttl=30.0)
    owner = fleet[0]
    own_drops = [node.proxy.apply_then_drop(kind="own", method="PUT", times=3) for node in fleet]
    batch_drops = owner.proxy.apply_then_drop(kind="batch", method="PUT", times=4)
    ledgers = warm(fleet, owner, "amb0", "amb1")
    for i, ledger in enumerate(ledgers):
        ledger.writer(fleet.live_urls, f"w{i}", timeout=20)
    try:
        progress(ledgers, 0, 10, 40, "with ambiguous commits")
        wait_for("every dropped batch answer", lambda: batch_drops.applied == 4, 20)
        owner.signal(signal.SIGTERM)
        assert owner.wait(30) == 0, owner.tail()
        progress(ledgers, time.time(), 5, 30, "after the owner drained")
    finally:
        for ledger in ledgers:
            ledger.stop_writers()
    dropped = [r for r in fleet.requests() if r.action == "apply_then_drop"]
    assert all(r.applied and r.status is None for r in dropped)
    assert own_drops[0].applied >= 2 and own_drops[1].applied + own_drops[2].applied >= 1
    fleet.check(ledgers)


def test_spurious_precondition_failures_on_takeover_claims_and_seals(
    make_fault_fleet: MakeFaultFleet,
) -> None:
    """The owner dies; on the survivors the store wrongly answers 412 to the first
    ownership claims and to the first seal (nothing written). The acquire tries again, a
    lost seal fails that activation (its calls never ran: ``not_run`` must mean absent) and
    the next one seals; nothing acknowledged is lost and each epoch has one owner."""
    fleet = make_fault_fleet(tag="pre")
    ledgers = warm(fleet, fleet[0], "pre0", "pre1")
    rules = [
        rule
        for node in fleet.nodes[1:]
        for rule in (
            node.proxy.spurious_412(kind="own", method="PUT", times=2),
            node.proxy.spurious_412(kind="seal", method="PUT", times=1),
        )
    ]
    for i, ledger in enumerate(ledgers):
        ledger.writer(fleet.urls_except(fleet[0]), f"w{i}", timeout=20)
    try:
        progress(ledgers, 0, 5, 30, "before the kill")
        fleet[0].signal(signal.SIGKILL)
        fleet[0].wait(10)
        progress(ledgers, time.time(), 5, 40, "after the takeover")
    finally:
        for ledger in ledgers:
            ledger.stop_writers()
    assert sum(rule.applied for rule in rules) >= 3, [rule.applied for rule in rules]
    fleet.check(ledgers)


def test_store_that_breaks_the_conditional_write_probe_is_refused(
    make_fault_fleet: MakeFaultFleet,
) -> None:
    """The store answers 412 to the probe's first conditional create (as a store that
    ignores If-None-Match semantics might): ``serve`` refuses to start, exit 2, naming the
    probe, and never takes a lease."""
    fleet = make_fault_fleet(size=1, tag="probe", start=False)
    node = fleet[0]
    node.proxy.spurious_412(kind="probe", method="PUT", times=1)
    node.start()
    assert node.wait(30) == 2, node.tail()
    assert [line for line in node.lines() if line.startswith("error:") and "probe" in line]
    assert not node.proxy.requests(kind="lease", method="PUT")
