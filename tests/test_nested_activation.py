"""Activations that activate other cells: more at once than the ownership pool has threads.

An ownership actor waits, on a pool thread, for its cell's ``on_activate``; when that calls
another cell that is not active yet, the other cell's activation needs a pool thread too.
With every thread waiting so, nothing could run the activations they wait for, and each
would fail at its timeout. The pool lets a thread that waits on a cell not count."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator

import pytest

from cellactors import CellActor, Node, NodeSettings
from cellactors.actors.pools import NodePools
from cellactors.persistence.store.s3 import S3Bucket
from tests.helpers.cells import Counter
from tests.helpers.runtime import TTL

CAP = 2  # ownership pool threads that may run unblocked in this test
CELLS = 3 * CAP


class Greeter(CellActor):
    """Counts its activations in another cell, from ``on_activate``."""

    def on_activate(self) -> None:
        self.cell(Counter, f"for-{self.name}").increment(name="activations")

    def hello(self) -> str:
        return f"hello from {self.name}"


@pytest.fixture
def small_pools() -> Iterator[NodePools]:
    pools = NodePools.create("n1", ownership_cap=CAP)
    yield pools
    pools.shutdown()


def test_activations_that_activate_others_do_not_starve_the_pool(
    sw_bucket: S3Bucket, small_pools: NodePools
) -> None:
    settings = NodeSettings(
        lease_ttl=TTL, advertise="127.0.0.1:1", op_deadline=3.0, call_timeout=20.0
    )
    node = Node(sw_bucket, "n1", [Greeter, Counter], settings, pools=small_pools).start()
    try:
        with concurrent.futures.ThreadPoolExecutor(CELLS) as callers:
            answers = list(callers.map(lambda i: node.cell(Greeter, f"g{i}").hello(), range(CELLS)))
        assert answers == [f"hello from g{i}" for i in range(CELLS)]
        for i in range(CELLS):
            assert node.cell(Counter, f"for-g{i}").get(name="activations") == 1
        assert small_pools.ownership.peak_unblocked() <= CAP
    finally:
        node.stop()
