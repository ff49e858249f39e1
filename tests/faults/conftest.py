"""Fixtures of the fault-injection suite: fleets whose nodes each talk to the session's
SeaweedFS through their own fault proxy."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from cellactors.persistence.store.embedded import SeaweedServer
from tests.faults.harness import FaultFleet

MakeFaultFleet = Callable[..., FaultFleet]


@pytest.fixture
def make_fault_fleet(tmp_path: Path, seaweed: SeaweedServer) -> Iterator[MakeFaultFleet]:
    """``make_fault_fleet(size=3, lease_ttl=2.0, tag="f", extra=(), start=True)``: a fleet on
    a fresh bucket; every process is killed and every proxy stopped at teardown."""
    fleets: list[FaultFleet] = []

    def make(
        size: int = 3,
        lease_ttl: float = 2.0,
        tag: str = "f",
        extra: Sequence[str] = (),
        start: bool = True,
    ) -> FaultFleet:
        fleet = FaultFleet(tmp_path / f"f{len(fleets)}", seaweed, size, lease_ttl, tag, extra)
        fleets.append(fleet)
        if start:
            fleet.start()
        return fleet

    yield make
    for fleet in fleets:
        fleet.stop()
        # Shown by pytest with a failing test only: each node's last warnings and errors.
        for node in fleet.nodes:
            worse = [line for line in node.lines() if " WARNING " in line or " ERROR " in line]
            print(f"--- {node.node_id}: last warnings and errors", *worse[-20:], sep="\n")
