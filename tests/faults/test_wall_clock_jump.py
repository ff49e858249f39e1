"""Wall clocks that jump in real ``cellactors serve`` processes (a preloaded shim moves
``CLOCK_REALTIME`` of one process; its monotonic clocks and sleeps are untouched): leases,
takeovers and alarms follow the store's clock, so a jump changes nothing a peer or a caller
can see. Before, a node whose clock jumped 15 s ahead took a live owner's cell at once (and
the owner then served stale reads), an owner whose clock jumped back wrote a lease that had
already lapsed, and one whose clock jumped ahead made its cells wait 15 s after its death.
Lease TTL 3 s."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import httpx
import pytest

from cellactors.core import keys
from tests.faults.conftest import MakeFaultFleet
from tests.faults.harness import FaultFleet, FaultNode, warm
from tests.faults.ledger import Ledger
from tests.helpers.clockshift import WallShift, build
from tests.helpers.fleet import wait_for

pytestmark = pytest.mark.faults

TTL = 3.0


@pytest.fixture
def shift(tmp_path: Path) -> WallShift:
    return WallShift(build(tmp_path / "shim"), tmp_path / "wall-shift")


def shifted_fleet(
    make_fault_fleet: MakeFaultFleet, shift: WallShift, tag: str, which: int
) -> FaultFleet:
    """Two nodes; node ``which`` runs with the movable wall clock."""
    fleet = make_fault_fleet(size=2, lease_ttl=TTL, tag=tag, start=False)
    fleet[which].proc.env = shift.env
    return fleet.start()


def jump(node: FaultNode, shift: WallShift, seconds: float) -> None:
    """Move ``node``'s wall clock and wait until its watchdog saw the jump (logged once)."""
    shift.set(seconds)
    wait_for(f"{node.node_id} to see its clock jump", lambda: jumps_logged(node) == 1, 5)


def jumps_logged(node: FaultNode) -> int:
    return sum("wall clock jumped" in line for line in node.lines())


def entries(node: FaultNode, cell: str) -> list[str]:
    resp = httpx.post(f"{node.public_url}/cells/Ledger/{cell}/entries", json={}, timeout=10)
    assert resp.status_code == 200, resp.text
    result: list[str] = resp.json()["result"]
    return result


def lease_expiry_ms(fleet: FaultFleet, node: FaultNode) -> int:
    found = fleet.bucket.get(keys.lease_key(node.node_id))
    assert found is not None
    return int(json.loads(found.body)["expires_ms"])


def taken_over_by(ledger: Ledger, node: FaultNode, timeout: float) -> float:
    """Append through ``node`` until ``node`` itself executes one; the seconds it took."""
    started = time.monotonic()
    tries = iter(range(10**6))
    wait_for(
        f"{node.node_id} to take the cell over",
        lambda: (
            ledger.append(node.public_url, f"after-{next(tries)}", timeout=10).node == node.node_id
        ),
        timeout,
    )
    return time.monotonic() - started


def appends_stay_with_the_owner(
    fleet: FaultFleet, ledger: Ledger, via: FaultNode, owner: FaultNode, seconds: float
) -> None:
    """For ``seconds`` (more than a TTL): every append through ``via`` is executed by
    ``owner``, and the owner's next read shows it (a takeover would leave the owner
    answering from a stale copy)."""
    end = time.monotonic() + seconds
    i = 0
    while time.monotonic() < end:
        entry = f"{via.node_id}-{i}"
        i += 1
        attempt = ledger.append(via.public_url, entry, timeout=20)
        assert attempt.acked and attempt.node == owner.node_id, attempt
        assert entry in entries(owner, ledger.cell), f"{owner.node_id} answered a stale read"
    assert i >= 5
    for node in fleet:
        assert not [line for line in node.lines() if "took over" in line], node.tail()
        assert node.fence_time() is None, node.tail()


def test_a_node_whose_clock_jumps_ahead_never_takes_a_live_owners_cell(
    make_fault_fleet: MakeFaultFleet, shift: WallShift
) -> None:
    fleet = shifted_fleet(make_fault_fleet, shift, "jumpy", which=1)
    owner, jumped = fleet[0], fleet[1]
    (ledger,) = warm(fleet, owner, "cj")
    jump(jumped, shift, +15)
    appends_stay_with_the_owner(fleet, ledger, jumped, owner, 2.5 * TTL)
    # Its own lease is written in the store's time, not 15 s ahead.
    assert lease_expiry_ms(fleet, jumped) <= time.time() * 1000 + TTL * 1000 + 1_500
    metrics = httpx.get(jumped.proc.internal_url + "/metrics", timeout=5).text
    assert 'cellactors_clock_jumps_total{clock="wall"} 1.0' in metrics
    assert jumps_logged(jumped) == 1  # once per jump, not per renewal or call
    # The owner dies: the jumped node takes the cell once the lease lapsed, no later.
    owner.signal(signal.SIGKILL)
    assert taken_over_by(ledger, jumped, TTL + 10) <= TTL + 3.0
    fleet.check([ledger])


def test_an_owner_whose_clock_jumps_back_keeps_its_cells(
    make_fault_fleet: MakeFaultFleet, shift: WallShift
) -> None:
    """Its next lease write would have expired 15 s ago by every other clock: now it is in
    the store's time, and the peer keeps routing to the owner."""
    fleet = shifted_fleet(make_fault_fleet, shift, "back", which=0)
    owner, peer = fleet[0], fleet[1]
    (ledger,) = warm(fleet, owner, "cb")
    jump(owner, shift, -15)
    written = lease_expiry_ms(fleet, owner)
    wait_for("a renewal after the jump", lambda: lease_expiry_ms(fleet, owner) > written, TTL)
    assert lease_expiry_ms(fleet, owner) > time.time() * 1000 + TTL * 1000 / 3
    appends_stay_with_the_owner(fleet, ledger, peer, owner, 2.5 * TTL)
    fleet.check([ledger])


def test_an_owner_whose_clock_jumped_ahead_is_replaced_one_ttl_after_its_death(
    make_fault_fleet: MakeFaultFleet, shift: WallShift
) -> None:
    fleet = shifted_fleet(make_fault_fleet, shift, "ahead", which=0)
    owner, peer = fleet[0], fleet[1]
    (ledger,) = warm(fleet, owner, "ca")
    jump(owner, shift, +15)
    written = lease_expiry_ms(fleet, owner)
    wait_for("a renewal after the jump", lambda: lease_expiry_ms(fleet, owner) > written, TTL)
    assert lease_expiry_ms(fleet, owner) <= time.time() * 1000 + TTL * 1000 + 1_500
    owner.signal(signal.SIGKILL)
    assert taken_over_by(ledger, peer, TTL + 20) <= TTL + 3.0
    fleet.check([ledger])
