"""Transient store errors on the node lease must not fence a node; only a lease taken by
another process generation does. Lease TTL 2 s: renewals every ~0.67 s, self-fence deadline
~1.33 s after the last renewal that succeeded was sent."""

from __future__ import annotations

import json
import time

import pytest

from cellactors.persistence.store.embedded import SeaweedServer
from tests.faults.conftest import MakeFaultFleet
from tests.faults.harness import FaultFleet, FaultNode, keeps_serving, warm
from tests.faults.ledger import Ledger
from tests.faults.proxy import Request
from tests.helpers.fleet import wait_for

pytestmark = pytest.mark.faults

TTL = 2.0


def one_node(make_fault_fleet: MakeFaultFleet, tag: str) -> tuple[FaultFleet, FaultNode, Ledger]:
    fleet = make_fault_fleet(size=1, lease_ttl=TTL, tag=tag)
    node = fleet[0]
    (ledger,) = warm(fleet, node, tag)
    return fleet, node, ledger


def renewals_applied_after(node: FaultNode, t: float) -> list[Request]:
    return [
        r
        for r in node.proxy.requests(kind="lease", method="PUT", since=t)
        if r.applied and r.status == 200
    ]


def test_one_503_on_a_lease_renewal_does_not_fence(make_fault_fleet: MakeFaultFleet) -> None:
    fleet, node, ledger = one_node(make_fault_fleet, "l503")
    rule = node.proxy.fail(503, kind="lease", method="PUT", times=1)
    rule.wait_arrived(3 * TTL)
    failed_at = time.time()
    keeps_serving(node, ledger, 3 * TTL)
    assert renewals_applied_after(node, failed_at), "no renewal succeeded after the 503"
    fleet.check([ledger])


def test_a_10_percent_503_storm_on_lease_requests_does_not_fence(
    make_fault_fleet: MakeFaultFleet,
) -> None:
    """Seed 67 makes the very first lease request of the storm fail (so current code fences
    deterministically) and never fails two lease requests in a row within the first 60,
    so a runtime that retries a failed renewal once before its deadline rides it out."""
    fleet, node, ledger = one_node(make_fault_fleet, "storm")
    storm = node.proxy.fail(503, kind="lease", probability=0.1, seed=67, active_for=5 * TTL)
    storm.wait_arrived(3 * TTL)
    keeps_serving(node, ledger, 5 * TTL)
    assert storm.applied >= 2, storm.applied
    fleet.check([ledger])


def test_ambiguous_lease_renewal_read_back_as_applied_does_not_fence(
    make_fault_fleet: MakeFaultFleet,
) -> None:
    """A renewal is applied but its answer lost; the read-back finds this process's new
    expiry, so it counts as renewed: no fence, and later renewals carry the right token."""
    fleet, node, ledger = one_node(make_fault_fleet, "ambok")
    drop = node.proxy.apply_then_drop(kind="lease", method="PUT", times=1)
    drop.wait_arrived(3 * TTL)
    dropped_at = time.time()
    keeps_serving(node, ledger, 3 * TTL)
    assert renewals_applied_after(node, dropped_at), "no renewal succeeded after the drop"
    fleet.check([ledger])


def test_ambiguous_lease_renewal_whose_read_back_fails_does_not_fence(
    make_fault_fleet: MakeFaultFleet,
) -> None:
    """A renewal is applied but its answer lost, and every lease GET fails until the next
    renewal is sent: the read-back cannot tell. The next renewal (held at the proxy only
    until the test has stopped failing the GETs) then finds the lease rewritten by this
    very process; that is no reason to fence."""
    fleet, node, ledger = one_node(make_fault_fleet, "ambl")
    drop = node.proxy.apply_then_drop(kind="lease", method="PUT", times=1)
    read_back = node.proxy.fail(503, kind="lease", method="GET")
    following = node.proxy.hold(kind="lease", method="PUT", times=1)
    drop.wait_arrived(3 * TTL)
    wait_for(
        "the next renewal to be sent (or the node to exit)",
        lambda: following.arrived.is_set() or not node.running,
        3 * TTL,
    )
    node.proxy.remove(read_back)
    following.release()
    assert read_back.applied >= 1, "the ambiguous renewal was never read back"
    keeps_serving(node, ledger, 3 * TTL)
    fleet.check([ledger])


def test_startup_backs_off_while_lease_writes_answer_503(
    make_fault_fleet: MakeFaultFleet,
) -> None:
    """For 3 s from the node's first lease write, every lease PUT answers 503: at most ~30
    lease requests in that window, then the node starts normally."""
    fleet = make_fault_fleet(size=1, lease_ttl=TTL, tag="bootput", start=False)
    node = fleet[0]
    outage = node.proxy.fail(503, kind="lease", method="PUT", active_for=3.0)
    node.start().ready(30)
    assert outage.first_match is not None and outage.applied >= 1
    window = [
        r
        for r in node.proxy.requests(kind="lease", since=outage.first_match)
        if r.arrived <= outage.first_match + 3.0
    ]
    assert len(window) <= 30, f"{len(window)} lease requests in the 3 s outage"
    keeps_serving(node, Ledger("bootput"), TTL)


def test_startup_rides_out_a_3s_outage_of_every_lease_request(
    make_fault_fleet: MakeFaultFleet,
) -> None:
    """For 3 s from the node's first lease request, every lease request (GET and PUT)
    answers 503: at most ~30 lease requests in that window, then the node starts normally.

    Current code passes through the S3 client's own retries of the lease read (6 attempts,
    jittered backoff of up to 1, 2, 4, 8, 16 s); in the rare draw (about 0.2%) where all six
    fall inside the 3 s, ``take()`` gives up and ``serve`` exits 2, which this test reports.
    """
    fleet = make_fault_fleet(size=1, lease_ttl=TTL, tag="bootall", start=False)
    node = fleet[0]
    outage = node.proxy.fail(503, kind="lease", active_for=3.0)
    node.start().ready(40)
    assert outage.first_match is not None and outage.applied >= 1
    window = [
        r
        for r in node.proxy.requests(kind="lease", since=outage.first_match)
        if r.arrived <= outage.first_match + 3.0
    ]
    assert len(window) <= 30, f"{len(window)} lease requests in the 3 s outage"
    keeps_serving(node, Ledger("bootall"), TTL)


def test_renewal_rejected_because_another_generation_took_the_identity_fences(
    make_fault_fleet: MakeFaultFleet, seaweed: SeaweedServer
) -> None:
    """Someone else (another process generation) rewrote ``nodes/<node>.json``: the next
    renewal's If-Match fails with 412, and that one does fence: exit 3, SELF-FENCE line,
    nothing acknowledged after."""
    fleet, node, ledger = one_node(make_fault_fleet, "usurp")
    key = f"nodes/{node.node_id}.json"
    current = fleet.bucket.get(key)
    assert current is not None
    record = json.loads(current.body)
    record.update(generation="f" * 16, expires_ms=int(time.time() * 1000) + 60_000)
    usurped = time.time()
    fleet.bucket.put(key, json.dumps(record).encode())
    assert node.wait(3 * TTL) == 3, node.tail()
    rejected = node.proxy.requests(kind="lease", method="PUT", since=usurped)
    assert rejected and rejected[-1].status == 412
    assert node.fence_time() is not None
    late = [a for a in ledger.acked() if a.done > usurped]
    assert not late
    fleet.check([ledger], read_urls=[])
