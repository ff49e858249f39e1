"""Process faults under write load, each ending with the ledger checks: an owner killed and
restarted, an owner paused past its lease, restarts while calls are routed to the node, and
a graceful drain. Every node reaches the store through its own fault proxy, whose logs feed
the ownership checks."""

from __future__ import annotations

import json
import signal
import threading
import time

import httpx
import pytest

from tests.faults.conftest import MakeFaultFleet
from tests.faults.harness import FENCE_MARK, FaultNode, progress, warm
from tests.faults.ledger import Attempt, LedgerWriter
from tests.helpers.fleet import wait_for

pytestmark = pytest.mark.faults


def test_owner_killed_under_load_and_restarted_loses_no_acknowledged_write(
    make_fault_fleet: MakeFaultFleet,
) -> None:
    """SIGKILL the owner of two loaded cells: a peer takes them over at a higher epoch once
    the lease lapses, the dead node acknowledged nothing, and the node restarted with the
    same id rejoins; every acknowledged write is in the live and the restored ledger."""
    fleet = make_fault_fleet(tag="crash")
    victim = fleet[0]
    ledgers = warm(fleet, victim, "crash0", "crash1")
    before = fleet.epoch("crash0")
    for i, ledger in enumerate(ledgers):
        ledger.writer(fleet.live_urls, f"w{i}", timeout=10)
    try:
        progress(ledgers, 0, 15, 30, "before the kill")
        victim.signal(signal.SIGKILL)
        assert victim.wait(10) == -signal.SIGKILL
        killed = time.time()
        progress(ledgers, killed, 5, 30, "after the takeover")
        victim.start().ready(30)
        back = time.time()
        progress(ledgers, back, 5, 30, "after the restart")
    finally:
        for ledger in ledgers:
            ledger.stop_writers()
    for ledger in ledgers:
        late = [a for a in ledger.acked_after(killed) if a.node == victim.node_id and a.done < back]
        assert not late, f"acknowledged by the dead node: {late}"
    owner = fleet.owner("crash0")
    assert fleet.epoch("crash0") > before
    fleet.check(ledgers)
    assert owner.running


def test_paused_owner_acknowledges_nothing_after_takeover_and_fences(
    make_fault_fleet: MakeFaultFleet,
) -> None:
    """SIGSTOP the owner past its lease TTL: a peer takes over; after SIGCONT the resumed
    process must acknowledge nothing (not even calls queued for it while stopped) and exit
    3 with a SELF-FENCE line."""
    fleet = make_fault_fleet(tag="pause")
    victim = fleet[0]
    (ledger,) = warm(fleet, victim, "pause")
    before = fleet.epoch("pause")
    ledger.writer(fleet.urls_except(victim), "w", timeout=4)
    direct: list[Attempt] = []
    try:
        progress([ledger], 0, 10, 30, "before the pause")
        victim.signal(signal.SIGSTOP)
        stopped = time.time()
        wait_for(
            "a takeover by another node",
            lambda: [a for a in ledger.acked_after(stopped) if a.node != victim.node_id],
            30,
        )
        # Calls sent to the stopped owner wait in its kernel queue; they run after SIGCONT.
        senders = [
            threading.Thread(
                target=lambda i=i: direct.append(
                    ledger.append(victim.public_url, f"direct-{i}", timeout=30)
                ),
                daemon=True,
            )
            for i in range(3)
        ]
        for t in senders:
            t.start()
        wait_for("the direct calls to be queued", lambda: _queued(victim, 3), 10)
        resumed = time.time()
        victim.signal(signal.SIGCONT)
        assert victim.wait(30) == 3, victim.tail()
        for t in senders:
            t.join(30)
    finally:
        ledger.stop_writers()
    assert any(line.startswith(FENCE_MARK) for line in victim.lines()), victim.tail()
    assert victim.fence_time() is not None, "no timestamped SELF-FENCE log line"
    late = [a for a in ledger.acked() if a.node == victim.node_id and a.done >= resumed]
    assert not late, f"the resumed owner acknowledged: {late}"
    assert len(direct) == 3 and not any(a.acked for a in direct), direct
    assert fleet.epoch("pause") > before
    entries = fleet.check([ledger])["pause"]
    assert not [e for e in entries if e.startswith("direct-")]


def _queued(node: FaultNode, count: int) -> bool:
    """Whether ``count`` connections to the node's public port are established (the kernel
    accepted them for the stopped process)."""
    port = f":{node.proc.public_port:04X}"
    established = 0
    with open("/proc/net/tcp") as table:
        for line in table.readlines()[1:]:
            fields = line.split()
            if fields[1].endswith(port) and fields[3] == "01":
                established += 1
    return established >= count


def test_node_restarted_while_calls_are_routed_to_it_loses_nothing(
    make_fault_fleet: MakeFaultFleet,
) -> None:
    """The owner restarts (SIGTERM, then SIGKILL) while its peers forward calls to it: the
    peers' routes go stale, the restarted process takes its identity back and the cells
    again, and no acknowledged write is lost on the way."""
    fleet = make_fault_fleet(tag="race")
    owner = fleet[0]
    ledgers = warm(fleet, owner, "race0", "race1")
    writers: list[LedgerWriter] = []
    for i, ledger in enumerate(ledgers):
        # Mostly through the peers, which forward to the owner; sometimes to it directly.
        writers.append(
            ledger.writer(
                lambda: [fleet[1].public_url, fleet[2].public_url, owner.public_url],
                f"w{i}",
                timeout=10,
            )
        )
    try:
        progress(ledgers, 0, 10, 30, "before the restarts")
        owner.signal(signal.SIGTERM)
        assert owner.wait(30) == 0, owner.tail()
        owner.start().ready(30)
        progress(ledgers, time.time(), 5, 30, "after a graceful restart")
        owner.signal(signal.SIGKILL)
        owner.wait(10)
        owner.start().ready(30)  # waits for its old lease, if no peer took its cells first
        progress(ledgers, time.time(), 5, 30, "after a restart from SIGKILL")
    finally:
        for ledger in ledgers:
            ledger.stop_writers()
    fleet.check(ledgers)
    for ledger in ledgers:
        assert len(fleet.fleet.owners(f"Ledger:{ledger.cell}")) == 1


def test_drain_under_load_exits_0_and_keeps_every_acknowledged_write(
    make_fault_fleet: MakeFaultFleet,
) -> None:
    """SIGTERM while calls are in flight (uploads slowed, and one held at the proxy until the
    drain has begun, so that a call is certainly waiting for durability when it starts):
    exit 0, the cells released, the lease expired, nothing acknowledged lost, and the held
    call answered once its upload landed."""
    fleet = make_fault_fleet(tag="drain", lease_ttl=30.0)
    leaving = fleet[0]
    ledgers = warm(fleet, leaving, "drain0", "drain1", "drain2")
    for i, ledger in enumerate(ledgers):
        ledger.writer(fleet.live_urls, f"w{i}", timeout=20)
    try:
        progress(ledgers, 0, 8, 30, "before the drain")
        upload = leaving.proxy.hold(kind="batch", method="PUT", times=1)
        leaving.proxy.delay(0.2, kind="batch", method="PUT")
        upload.wait_held(1, 10)
        term = time.time()
        leaving.signal(signal.SIGTERM)
        wait_for("the node to report draining", lambda: not healthy(leaving), 10)
        upload.release()
        assert leaving.wait(30) == 0, leaving.tail()
        progress(ledgers, time.time(), 5, 15, "after the drain (well inside the 30 s TTL)")
    finally:
        for ledger in ledgers:
            ledger.stop_writers()
    assert leaving.fence_time() is None
    lease = fleet.bucket.get(f"nodes/{leaving.node_id}.json")
    assert lease is not None and json.loads(lease.body)["expires_ms"] == 0
    (landed,) = leaving.proxy.requests(action="hold")
    assert landed.applied and landed.store_answered is not None
    in_flight = [a for ledger in ledgers for a in ledger.acked() if a.sent < term < a.done]
    assert any(a.done >= landed.store_answered for a in in_flight), "the held call was lost"
    fleet.check(ledgers)
    for ledger in ledgers:
        assert fleet.owner(ledger.cell) is not leaving


def healthy(node: FaultNode) -> bool:
    """Whether the node's public /healthz answers 200 (503 while draining or fenced)."""
    return httpx.get(node.public_url + "/healthz", timeout=2).status_code == 200
