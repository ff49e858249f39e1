"""A self-fenced node stops writing at once: nothing reaches the store after its
``SELF-FENCE:`` line, it exits 3 promptly, and calls it held get an ``unknown`` outcome
(they committed and may be in the bucket), never ``not_run``."""

from __future__ import annotations

import json
import signal
import threading
import time

import pytest

from tests.faults.conftest import MakeFaultFleet
from tests.faults.harness import held_calls, warm
from tests.faults.ledger import UNKNOWN, Attempt
from tests.helpers.fleet import wait_for

pytestmark = pytest.mark.faults

TTL = 2.0
HELD = 4
TOLERANCE = 0.05  # log timestamps are truncated to the millisecond; requests in flight


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


def test_call_whose_batch_landed_before_the_fence_is_not_reported_not_run(
    make_fault_fleet: MakeFaultFleet,
) -> None:
    """The owner's batch PUT lands, its ownership re-read is held at the proxy, then every
    lease request hangs so the owner fences with the call still held. The next owner
    restores the landed batch; the caller must have been told ``unknown``."""
    fleet = make_fault_fleet(size=2, lease_ttl=TTL, tag="landed")
    owner, peer = fleet[0], fleet[1]
    (ledger,) = warm(fleet, owner, "landed")
    re_read = owner.proxy.hold(kind="own", method="GET", times=1)
    answers: list[Attempt] = []
    caller = threading.Thread(
        target=lambda: answers.append(ledger.append(owner.public_url, "landed", timeout=40)),
        daemon=True,
    )
    caller.start()
    re_read.wait_held(1, 10)
    assert [r for r in owner.proxy.requests(kind="batch", method="PUT") if r.applied][-1:]
    owner.proxy.hang(kind="lease")
    owner.wait_fence_time(3 * TTL)
    caller.join(45)
    re_read.release()
    (answer,) = answers
    assert not answer.acked, answer

    def taken_over() -> bool:
        return ledger.append(peer.public_url, f"after-{time.time():.3f}").acked

    wait_for("the peer to take the cell over", taken_over, 30)
    entries = fleet.check([ledger], read_urls=[peer.public_url])["landed"]
    assert "landed" in entries  # the write is there: only "unknown" was a true answer
    assert answer.outcome == UNKNOWN, answer


def test_forwarded_call_held_at_an_owner_that_fences_is_not_run_twice(
    make_fault_fleet: MakeFaultFleet,
) -> None:
    """Peer B forwards a call to owner A; A's batch lands, its ownership re-read is held at
    the proxy and A is paused. C takes the cell over (restoring A's batch). A resumes and
    fences with the call still held. The caller must hear ``unknown``, and the call must
    not run a second time."""
    fleet = make_fault_fleet(size=3, lease_ttl=TTL, tag="twice")
    owner, forwarder, taker = fleet[0], fleet[1], fleet[2]
    (ledger,) = warm(fleet, owner, "twice")
    re_read = owner.proxy.hold(kind="own", method="GET", times=1)
    answers: list[Attempt] = []
    caller = threading.Thread(
        target=lambda: answers.append(ledger.append(forwarder.public_url, "dup", timeout=40)),
        daemon=True,
    )
    caller.start()
    re_read.wait_held(1, 10)
    owner.signal(signal.SIGSTOP)
    wait_for(
        "the paused owner's last lease renewal to be answered",
        lambda: all(r.answered is not None for r in owner.proxy.requests(kind="lease")),
        5,
    )
    lease = fleet.bucket.get(f"nodes/{owner.node_id}.json")
    assert lease is not None
    expires = json.loads(lease.body)["expires_ms"] / 1000
    wait_for("the paused owner's lease to expire", lambda: time.time() > expires + 0.2, 3 * TTL)

    def taken_over() -> bool:
        return ledger.append(taker.public_url, f"after-{time.time():.3f}", timeout=5).acked

    wait_for("another node to take the cell over", taken_over, 30)
    owner.signal(signal.SIGCONT)
    owner.wait_fence_time(10)
    re_read.release()
    caller.join(45)
    (answer,) = answers
    assert not answer.acked, answer
    entries = fleet.check([ledger], read_urls=[forwarder.public_url, taker.public_url])["twice"]
    assert "dup" in entries
    assert answer.outcome == UNKNOWN, answer
