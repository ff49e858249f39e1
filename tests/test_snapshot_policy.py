"""The snapshot policy counts the chain since the last snapshot across activations, so a
cell whose activations each write less than the threshold still gets snapshots and its
restores stay bounded."""

from __future__ import annotations

from cellactors.actors.snapshots import SnapshotPolicy
from cellactors.core import keys
from cellactors.persistence.store.s3 import S3Bucket
from tests.helpers.cells import Counter
from tests.helpers.runtime import eventually, host_of, make_node

CELL = "Counter:a"


def snapshots(bucket: S3Bucket) -> list[str]:
    return [i.key for i in bucket.list(keys.cell_root(CELL) + "snap/")]


def test_chain_is_counted_across_activations_on_different_nodes(sw_bucket: S3Bucket) -> None:
    policy = SnapshotPolicy(every_txids=10)
    a = make_node(sw_bucket, "na", snapshots=policy)
    try:
        for _ in range(6):  # 7 txids with the table's creation: below the threshold
            a.cell(Counter, "a").increment("x")
        a.drain()
    finally:
        a.stop()
    assert snapshots(sw_bucket) == []
    b = make_node(sw_bucket, "nb", snapshots=policy)
    try:
        for _ in range(4):  # 7 restored + 3 reaches 10 since the (absent) last snapshot
            b.cell(Counter, "a").increment("x")
        eventually(lambda: len(snapshots(sw_bucket)) == 1, timeout=10)
        assert snapshots(sw_bucket) == [keys.snapshot_key(CELL, 10, 2)]
    finally:
        b.stop()


def test_chain_is_counted_across_a_passivation_on_one_node(sw_bucket: S3Bucket) -> None:
    a = make_node(sw_bucket, "na", snapshots=SnapshotPolicy(every_txids=10))
    try:
        for _ in range(6):
            a.cell(Counter, "a").increment("x")
        assert a.passivate(CELL)
        for _ in range(4):
            a.cell(Counter, "a").increment("x")
        host = host_of(a, CELL)
        assert host.active is not None and host.active.restored_from == "local"
        eventually(lambda: len(snapshots(sw_bucket)) == 1, timeout=10)
    finally:
        a.stop()
