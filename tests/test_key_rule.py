"""One idempotency-key rule (cellactors.core.idempotency), wherever a key enters: a keyed
call between cells behaves the same whether its target lives on the caller's node or on a
peer reached through the signed internal listener (real runners on loopback, a real
SeaweedFS). Before the rule had one home, ``with_key("order 17")`` ran against a local
target and was refused against a remote one."""

from __future__ import annotations

import pytest

from cellactors import CellActor
from cellactors.core.idempotency import MAX_KEY_LENGTH, check_key, valid_key
from cellactors.errors import BadRequest, CallError
from cellactors.persistence.store.s3 import S3Bucket
from tests.helpers.cells import Counter
from tests.helpers.served import served_node


class KeyedCaller(CellActor):
    """Calls a Counter under a given key and says how it went."""

    def call_with_key(self, target: str, key: str) -> str:
        try:
            return str(self.cell("Counter", target).with_key(key).increment(name="x"))
        except CallError as err:
            return f"{err.code}/{err.outcome}"


@pytest.mark.parametrize(
    ("key", "valid"),
    [
        ("order-17", True),
        ("a", True),
        ("A.b_c:d-9", True),
        ("k" * MAX_KEY_LENGTH, True),
        ("", False),
        ("order 17", False),
        ("k" * (MAX_KEY_LENGTH + 1), False),
        ("ключ", False),
        ("a\nb", False),
        (17, False),
    ],
)
def test_the_rule(key: object, valid: bool) -> None:
    assert valid_key(key) is valid
    if valid:
        assert check_key(key) == key
    else:
        with pytest.raises(BadRequest) as info:
            check_key(key)
        assert info.value.outcome == "not_run"


def test_a_keyed_call_between_cells_is_the_same_to_a_local_and_a_remote_target(
    sw_bucket: S3Bucket,
) -> None:
    classes = (Counter, KeyedCaller)
    with (
        served_node(sw_bucket, "n1", classes=classes) as n1,
        served_node(sw_bucket, "n2", classes=classes) as n2,
    ):
        n1.node.call("Counter", "near", "get", {"name": "x"})  # lives on n1
        n2.node.call("Counter", "far", "get", {"name": "x"})  # lives on n2
        caller = n1.node.cell(KeyedCaller, "c")
        results = {}
        for target in ("near", "far"):
            first = caller.call_with_key(target=target, key="order-17")
            again = caller.call_with_key(target=target, key="order-17")  # answered, not run
            refused = caller.call_with_key(target=target, key="order 17")
            results[target] = (first, again, refused)
        # Each ran once, on its own node: the remote one really went to the peer.
        assert n1.node.call("Counter", "near", "get", {"name": "x"}) == 1
        assert n2.node.call("Counter", "far", "get", {"name": "x"}) == 1
    assert results["near"] == results["far"] == ("1", "1", "bad_request/not_run")
