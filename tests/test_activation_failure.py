"""An activation whose ``on_activate`` raises: the caller learns the call never ran, and the
activation leaves nothing behind (no cell actor, no host, no local file)."""

from __future__ import annotations

import pykka
import pytest

from cellactors import CellActor, Node, NodeSettings
from cellactors.errors import ActivationFailed
from cellactors.persistence.s3 import S3Bucket
from tests.cells import Counter
from tests.runtime_helpers import TTL, eventually


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
        with pytest.raises(ActivationFailed, match="cannot activate") as info:
            node.cell(Broken, "b").get()
        assert info.value.outcome == "not_run"
        eventually(lambda: pykka.ActorRegistry.get_by_class(Broken) == [])
        assert "Broken:b" not in node._hosts
        assert not list(node.cells_dir.glob("Broken:b.*"))
        assert node.cell(Counter, "ok").increment(name="x") == 1  # the node serves on
    finally:
        node.stop()
