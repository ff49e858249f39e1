"""A self-fenced node stops writing at once: nothing reaches the store after its
``SELF-FENCE:`` line, it exits 3 promptly, and calls it held get an ``unknown`` outcome
(they committed and may be in the bucket), never ``not_run``."""

from __future__ import annotations

import threading
import time

import pytest

from tests.faults.conftest import MakeFaultFleet
from tests.faults.harness import held_calls, warm
from tests.faults.ledger import UNKNOWN, Attempt
from tests.fleet_harness import wait_for

pytestmark = pytest.mark.faults

TTL = 2.0
HELD = 4
TOLERANCE = 0.05  # log timestamps are truncated to the millisecond; requests in flight


@pytest.mark.xfail(
    strict=True,
    reason="needs the fix of the self-fence (stop every write, held calls unknown): on "
    "current code Node.fence fails held calls with NodeUnavailable (outcome not_run) although "
    "they committed, and only tells the replicator to stop, so its _retry loop keeps sending "
    "batch PUTs after the SELF-FENCE line until the 15 s operation deadline",
)
def test_fence_stops_all_writes_and_held_calls_are_unknown(
    make_fault_fleet: MakeFaultFleet,
) -> None:
    """Batch PUTs fail (503) so the replicator keeps retrying with calls held; then every
    lease request hangs, so no renewal succeeds and the node must fence itself."""
    fleet = make_fault_fleet(size=1, lease_ttl=TTL, tag="fence")
    node = fleet[0]
    (ledger,) = warm(fleet, node, "fence")
    node.proxy.fail(503, kind="batch", method="PUT")
    held: list[Attempt] = []
    callers = [
        threading.Thread(
            target=lambda i=i: held.append(ledger.append(node.public_url, f"held-{i}", timeout=40)),
            daemon=True,
        )
        for i in range(HELD)
    ]
    for t in callers:
        t.start()
    wait_for(
        f"{HELD} calls committed and held", lambda: held_calls(node, "Ledger:fence") >= HELD, 10
    )
    hung = node.proxy.hang(kind="lease")
    fenced_at = node.wait_fence_time(3 * TTL)
    wait_for("the fenced node to exit", lambda: node.exit_code is not None, 30)
    exited_at = time.time()
    for t in callers:
        t.join(45)
    assert hung.applied >= 1

    late = [
        f"{r.method} {r.key} ({r.arrived - fenced_at:+.3f}s)"
        for r in node.proxy.log()
        if r.is_write and r.arrived > fenced_at + TOLERANCE
    ]
    assert not late, f"writes after the SELF-FENCE line: {late[:10]} ({len(late)})"
    assert node.exit_code == 3, node.tail()
    assert exited_at - fenced_at <= 5.0 + 0.1, f"exit {exited_at - fenced_at:.2f}s after the fence"
    assert len(held) == HELD, held
    wrong = [a for a in held if a.acked or a.outcome != UNKNOWN]
    assert not wrong, f"held calls not failed as unknown: {wrong}"
    fleet.check([ledger], read_urls=[])
