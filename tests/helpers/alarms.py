"""Nodes that scan for alarms quickly, and what the bucket holds of wakes and owners."""

from __future__ import annotations

from typing import Any

from cellactors import Node, NodeSettings
from cellactors.persistence.control.ownership import OwnershipStore
from cellactors.persistence.control.wakes import parse_wake_key
from cellactors.persistence.store.bucket import Bucket
from cellactors.persistence.store.s3 import S3Bucket
from tests.helpers.alarm_cells import Flaky, Hop, Inbox, Reminder
from tests.helpers.runtime import TTL

CLASSES = [Reminder, Flaky, Hop, Inbox]


SCAN = 0.3


def alarm_node(bucket: Bucket, node_id: str, **kw: Any) -> Node:
    kw.setdefault("alarm_scan_interval", SCAN)
    settings = NodeSettings(lease_ttl=TTL, advertise=f"127.0.0.1:1{len(node_id)}", **kw)
    return Node(bucket, node_id, CLASSES, settings).start()


def wakes(bucket: S3Bucket) -> list[tuple[str, int]]:
    """(cell id, due ms) of every wake entry in the bucket."""
    found = []
    for info in bucket.list("wake/"):
        parsed = parse_wake_key(info.key)
        assert parsed is not None, info.key
        found.append((parsed[0], parsed[1].at_ms))
    return found


def owner(bucket: Bucket, cell_id: str) -> tuple[str, int]:
    record = OwnershipStore(bucket, "reader").read_owner(cell_id)
    assert record is not None
    return record.node, record.epoch
