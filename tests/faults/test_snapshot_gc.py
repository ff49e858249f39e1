"""The snapshot-GC race of a takeover, on real processes: the owner passivates (releasing
the cell) while its snapshot upload is still in flight, another node wants the cell, and
the snapshot then lands and its collection runs. Snapshot and collection are owner work:
the release waits for them, the collection reads ``own.json`` before deleting, and a restore
that finds a listed object gone lists again. No acknowledged write may be lost, live or in
``cellactors restore``."""

from __future__ import annotations

import threading

import pytest

from tests.faults.conftest import MakeFaultFleet
from tests.faults.harness import FaultFleet, warm
from tests.faults.ledger import Attempt
from tests.helpers.fleet import wait_for

pytestmark = pytest.mark.faults

TTL = 2.0
FLAGS = ("--snapshot-every", "4", "--retention", "0", "--idle-timeout", "1")


def snapshots(fleet: FaultFleet, cell: str) -> list[str]:
    return [i.key for i in fleet.bucket.list(f"cells/{cell}/snap/")]


def test_snapshot_in_flight_at_release_loses_nothing(make_fault_fleet: MakeFaultFleet) -> None:
    fleet = make_fault_fleet(size=2, lease_ttl=TTL, tag="sgc", extra=FLAGS)
    other, owner = fleet[0], fleet[1]
    cell = "Ledger:race"
    (ledger,) = warm(fleet, owner, "race")
    for i in range(4):  # past the threshold at epoch 1: a first snapshot lands
        assert ledger.append(owner.public_url, f"e1-{i}").acked
    wait_for("a first snapshot", lambda: len(snapshots(fleet, cell)) == 1, 20)
    wait_for("the owner to passivate", lambda: cell not in owner.proc.hosted(), 20)
    # Epoch 2 on the same node; its snapshot upload will be held in flight.
    held = owner.proxy.hold(kind="snapshot", method="PUT", times=1)
    for i in range(5):
        assert ledger.append(owner.public_url, f"e2-{i}").acked
    held.wait_held(1, 20)
    # The owner goes idle and passivates with the upload still held. Another node now
    # wants the cell; its snapshot GETs are held so a collection could race its restore.
    reads = other.proxy.hold(kind="snapshot", method="GET")
    answers: list[Attempt] = []
    caller = threading.Thread(
        target=lambda: answers.append(ledger.append(other.public_url, "during", timeout=40)),
        daemon=True,
    )
    caller.start()
    # Old runtimes released own.json at once, so the other node restored from a listing
    # that the owner's collection was about to empty; give that path a bounded chance.
    restoring = reads.arrived.wait(5)
    held.release()  # the snapshot lands; its collection runs (or is refused) now
    wait_for(
        "the held snapshot upload to be answered",
        lambda: all(r.answered is not None for r in owner.proxy.requests(kind="snapshot")),
        20,
    )
    reads.release()
    other.proxy.remove(reads)
    caller.join(45)
    assert answers and answers[0].acked, (restoring, answers)
    for i in range(3):
        assert ledger.append(other.public_url, f"after-{i}").acked
    fleet.check([ledger])
