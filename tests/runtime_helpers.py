"""Helpers for runtime tests: nodes on a shared bucket, waiting with deadlines."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from cellactors import Node, NodeSettings
from cellactors.persistence.bucket import Bucket
from cellactors.persistence.celldb import dump
from tests.cells import Counter, Sandbox

T = TypeVar("T")


def make_node(bucket: Bucket, node_id: str, ttl: float = 2.0, **kw: Any) -> Node:
    settings = NodeSettings(lease_ttl=ttl, advertise=f"127.0.0.1:1{len(node_id)}", **kw)
    return Node(bucket, node_id, [Counter, Sandbox], settings).start()


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
    host = node._hosts[cell_id]
    assert host.active is not None
    return dump(host.active.runtime.database.db)


def owner_epoch(node: Node, cell_id: str) -> tuple[str, int]:
    rec = node.ownership.read_owner(cell_id)
    assert rec is not None
    return rec.node, rec.epoch
