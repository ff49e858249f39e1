"""Helpers for runtime tests: nodes on a shared bucket, waiting with deadlines."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar

import pytest

from cellactors import Node, NodeSettings
from cellactors.actors.host import CellHost
from cellactors.actors.node.activations import Dormant
from cellactors.actors.ownership import Active
from cellactors.core.types import Applied, Match
from cellactors.persistence.celldb.database import dump
from cellactors.persistence.control.leases import LeaseStore
from cellactors.persistence.store.bucket import Bucket
from tests.helpers.cells import Counter, Sandbox

T = TypeVar("T")


# Leases a loaded machine can renew: a renewal every TTL/3 (1.7 s), a fence deadline 4 s after
# the last successful send (a CI machine running the suite on two workers has stalled a 3 s
# lease's renewals for 2 s). Tests that need a lease gone expire it with expire_lease().
TTL = 5.0


def make_node(bucket: Bucket, node_id: str, ttl: float = TTL, **kw: Any) -> Node:
    settings = NodeSettings(lease_ttl=ttl, advertise=f"127.0.0.1:1{len(node_id)}", **kw)
    return Node(bucket, node_id, [Counter, Sandbox], settings).start()


def crash(node: Node, bucket: Bucket, reason: str = "test: crashed") -> None:
    """Stop ``node`` as a crash would (no release of its cells or lease), then expire its
    lease in ``bucket`` as if its TTL had passed, so peers may take over at once."""
    node.lease.proxy().pause().get()
    node.fence(reason)
    expire_lease(bucket, node.node_id)


def expire_lease(bucket: Bucket, node_id: str) -> None:
    """Rewrite a node's lease with an expiry in the past: what peers see once its TTL has
    elapsed without a renewal. Guarded, so it fails if the node renewed meanwhile."""
    leases = LeaseStore(bucket, node_id)
    snap = leases.read_lease(node_id)
    assert snap is not None, f"node {node_id} has no lease"
    result = leases.cas_node_lease(Match(snap.token), replace(snap.lease, expires_ms=0))
    assert isinstance(result, Applied), result


def eventually(fn: Callable[[], T], timeout: float = 15.0, interval: float = 0.05) -> T:
    """Call ``fn`` until it returns without raising (and not False), or fail at the deadline."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            value = fn()
            if value is not False:
                return value
        except Exception as err:
            last = err
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s; last error: {last!r}")


def cell_dump(node: Node, cell_id: str) -> dict[str, Any]:
    return dump(active_of(node, cell_id).runtime.database.db)


def owner_epoch(node: Node, cell_id: str) -> tuple[str, int]:
    rec = node.ownership.read_owner(cell_id)
    assert rec is not None
    return rec.node, rec.epoch


def host_of(node: Node, cell_id: str) -> CellHost:
    """The cell's activation on ``node`` (it must have one)."""
    host = node.activations.host(cell_id)
    assert host is not None, f"{cell_id} has no activation on {node.node_id}"
    return host


def active_of(node: Node, cell_id: str) -> Active:
    """The cell, open on ``node`` (it must be)."""
    active = host_of(node, cell_id).active
    assert active is not None, f"{cell_id} is not open on {node.node_id}"
    return active


def dormant_of(node: Node, cell_id: str) -> Dormant:
    """The cell, hibernating on ``node`` (it must be)."""
    dormant = node.activations.dormant(cell_id)
    assert dormant is not None, f"{cell_id} does not hibernate on {node.node_id}"
    return dormant


def thread_starts(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the threads started from now on (until ``monkeypatch`` is undone)."""
    started: list[str] = []
    start = threading.Thread.start

    def counting_start(thread: threading.Thread) -> None:
        started.append(thread.name)
        start(thread)

    monkeypatch.setattr(threading.Thread, "start", counting_start)
    return started
