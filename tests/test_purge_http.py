"""``DELETE /cells/{cls}/{name}`` on the internal listener purges a cell through the node;
only a request signed with the fleet key is obeyed, and the public listener has no such
route."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from cellactors.core import keys
from cellactors.persistence.store.s3 import S3Bucket
from cellactors.server import signing
from tests.helpers.cells import Counter
from tests.helpers.served import KEY, ServedNode, served_node, with_fleet_key

CELL = "Counter:a"
PATH = "/cells/Counter/a"


@pytest.fixture
def node(sw_bucket: S3Bucket) -> Iterator[ServedNode]:
    with_fleet_key(sw_bucket)
    with served_node(sw_bucket, "na") as served:
        yield served


def test_a_signed_delete_purges_the_cell_and_nothing_else_does(
    node: ServedNode, sw_bucket: S3Bucket
) -> None:
    assert node.node.cell(Counter, "a").increment("x") == 1
    before = sorted(o.key for o in sw_bucket.list(keys.cell_root(CELL)))
    assert len(before) >= 2

    assert httpx.delete(node.internal + PATH, timeout=30).status_code == 401
    assert httpx.delete(node.public + PATH, timeout=30).status_code in (404, 405)
    assert sorted(o.key for o in sw_bucket.list(keys.cell_root(CELL))) == before

    headers = signing.sign_request(
        KEY,
        "DELETE",
        PATH,
        b"",
        source="operator",
        target=node.node.node_id,
        target_generation=node.node.generation,
    )
    answer = httpx.delete(node.internal + PATH, headers=headers, timeout=30)
    assert answer.status_code == 200, answer.text
    [done] = answer.json()["purged"]
    assert done["cell"] == CELL and done["fenced_epoch"] == 2
    assert done["deleted"] == len(before)
    assert list(sw_bucket.list(keys.cell_root(CELL))) == []
    assert node.node.cell(Counter, "a").get("x") == 0
