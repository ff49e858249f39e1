"""Each node owns its thread pools (cellactors.actors.pools): two nodes in one process never
share a thread, and a node that stops shuts its pools down, leaving no worker behind."""

from __future__ import annotations

import threading

import pytest

from cellactors.actors.threadpool import PoolClosed
from cellactors.persistence.store.s3 import S3Bucket
from tests.helpers.runtime import eventually, make_node


def test_two_nodes_have_their_own_pools_and_stop_them(sw_bucket: S3Bucket) -> None:
    a, b = make_node(sw_bucket, "pa"), make_node(sw_bucket, "pb")
    try:
        assert a.call("Counter", "x", "increment", {"name": "n"}) == 1
        assert b.call("Counter", "y", "increment", {"name": "n"}) == 1
        mine = {id(p) for p in vars(a.pools).values()}
        theirs = {id(p) for p in vars(b.pools).values()}
        assert not mine & theirs
        names = {t.name for t in threading.enumerate()}
        assert any(n.startswith("upload-pa") for n in names)  # named after their node
        assert any(n.startswith("upload-pb") for n in names)
    finally:
        a.stop()
    with pytest.raises(PoolClosed):
        a.pools.ownership.submit(lambda: None)
    with pytest.raises(RuntimeError):
        a.pools.uploads.submit(lambda: None)
    assert b.call("Counter", "y", "increment", {"name": "n"}) == 2  # b's pools serve on
    b.stop()

    def left() -> bool:
        return not any(
            t.name.startswith(("upload-pa", "upload-pb", "restore-pa", "restore-pb"))
            for t in threading.enumerate()
        )

    eventually(left, timeout=10)
