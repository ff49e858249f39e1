"""An activation whose ``on_activate`` raises: the caller learns the call never ran, and the
activation leaves nothing behind (no cell actor, no host, no local file). Likewise when
``on_activate``'s own write cannot be proven durable."""

from __future__ import annotations

import time

import pykka
import pytest

from cellactors import CellActor, Node, NodeSettings
from cellactors.errors import ActivationFailed, ActivationRaised
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


def test_on_activate_whose_write_cannot_be_proven_fails_the_activation_as_not_run(
    sw_bucket: S3Bucket,
) -> None:
    # on_activate runs in the activating thread and waits for its own write's
    # acknowledgement: a store that never answers the upload fails the activation at the
    # deadline, and the call that caused it did not run.
    slow = HangingBucket(sw_bucket)
    node = make_node(slow, "n1", op_deadline=1.0)
    try:
        slow.hang = True
        started = time.monotonic()
        with pytest.raises(ActivationFailed, match="could not be proven within 1s") as info:
            node.cell(Counter, "a").increment("x")
        assert info.value.outcome == "not_run"
        assert time.monotonic() - started < 5.0
        assert node.activations.host("Counter:a") is None
        slow.hang = False
        slow.release.set()
        # The next call activates it again; the unproven table creation is harmless either
        # way (on_activate creates it if it is missing), and nothing was counted.
        eventually(lambda: node.cell(Counter, "a").get("x") == 0)
        assert node.cell(Counter, "a").increment("x") == 1
    finally:
        slow.release.set()
        node.stop()
