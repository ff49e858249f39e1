"""An activation whose ``on_activate`` raises: the caller learns the call never ran, and the
activation leaves nothing behind (no cell actor, no host, no local file). When
``on_activate``'s own write cannot be proven durable, neither can the first call's, which
shared its upload: that call's outcome is unknown."""

from __future__ import annotations

import time

import pykka
import pytest

from cellactors import CellActor, Node, NodeSettings
from cellactors.errors import ActivationRaised, NotDurable
from cellactors.persistence.store.s3 import S3Bucket
from tests.helpers.buckets import HangingBucket
from tests.helpers.cells import Counter
from tests.helpers.runtime import TTL, eventually, make_node


class Broken(CellActor):
    """Its ``on_activate`` writes, then raises: the transaction rolls back."""

    def on_activate(self) -> None:
        self.db.execute("CREATE TABLE IF NOT EXISTS t (x INTEGER)")
        raise ValueError("cannot activate")

    def get(self) -> int:
        return 1


def test_on_activate_raising_fails_the_activation_and_leaves_nothing(
    sw_bucket: S3Bucket,
) -> None:
    settings = NodeSettings(lease_ttl=TTL, advertise="127.0.0.1:1")
    node = Node(sw_bucket, "n1", [Broken, Counter], settings).start()
    try:
        with pytest.raises(ActivationRaised, match="cannot activate") as info:
            node.cell(Broken, "b").get()
        assert info.value.outcome == "not_run" and not info.value.retryable
        eventually(lambda: pykka.ActorRegistry.get_by_class(Broken) == [])
        assert node.activations.host("Broken:b") is None
        assert not list(node.cells_dir.glob("Broken:b.*"))
        assert node.cell(Counter, "ok").increment(name="x") == 1  # the node serves on
    finally:
        node.stop()


def test_on_activate_whose_write_cannot_be_proven_fails_its_first_call_as_unknown(
    sw_bucket: S3Bucket,
) -> None:
    # on_activate's write travels in one batch with the first call's (the activation does
    # not wait for it): a store that never answers that upload fails the call at the
    # deadline as not proven (it ran, and may have landed), resets the cell, and the next
    # activation sees either both writes or neither, never the call without its schema.
    slow = HangingBucket(sw_bucket)
    node = make_node(slow, "n1", op_deadline=1.0)
    try:
        slow.hang = True
        started = time.monotonic()
        with pytest.raises(NotDurable, match="could not be proven within 1s") as info:
            node.cell(Counter, "a").increment("x")
        assert info.value.outcome == "unknown"
        assert time.monotonic() - started < 5.0
        slow.hang = False
        slow.release.set()
        eventually(lambda: node.cell(Counter, "a").get("x") in (0, 1))
        before = node.cell(Counter, "a").get("x")
        assert node.cell(Counter, "a").increment("x") == before + 1
    finally:
        slow.release.set()
        node.stop()
