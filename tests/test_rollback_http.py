"""Rolling back over the internal listener and through ``cellactors rollback``: a served
node, requests signed with the fleet key; unsigned, forged or malformed ones change
nothing, and a node that does not own the cell names the one that does."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from click.testing import CliRunner, Result

from cellactors.cli import main
from cellactors.persistence.store.embedded import SeaweedServer
from cellactors.persistence.store.s3 import S3Bucket
from cellactors.server import signing
from tests.helpers.cells import Counter
from tests.helpers.served import KEY, ServedNode, served_node, with_fleet_key

PATH = "/cells/Counter/a/rollback"


@pytest.fixture
def bucket(sw_bucket: S3Bucket) -> S3Bucket:
    with_fleet_key(sw_bucket)
    return sw_bucket


@pytest.fixture
def node(bucket: S3Bucket) -> Iterator[ServedNode]:
    with served_node(bucket, "na") as served:
        yield served


def signed(served: ServedNode, body: bytes, key: bytes = KEY) -> httpx.Response:
    headers = signing.sign_request(
        key,
        "POST",
        PATH,
        body,
        source="operator",
        target=served.node.node_id,
        target_generation=served.node.generation,
    )
    headers["content-type"] = "application/json"
    return httpx.post(served.internal + PATH, content=body, headers=headers, timeout=30)


def cli(bucket: S3Bucket, seaweed: SeaweedServer, url: str, *args: str) -> Result:
    store = ["--bucket", f"s3://{bucket.bucket}", "--endpoint", seaweed.endpoint]
    return CliRunner().invoke(
        main, ["rollback", *store, "--node", url, "--cell", "Counter:a", "--yes", *args]
    )


def test_only_a_signed_well_formed_request_rolls_back(node: ServedNode) -> None:
    cell = node.node.cell(Counter, "a")
    for _ in range(3):
        cell.increment("x")  # txids 2, 3, 4 (1 created the table)
    body = json.dumps({"to_txid": 2}).encode()

    assert httpx.post(node.internal + PATH, content=body, timeout=30).status_code == 401
    assert signed(node, body, key=b"k" * 32).status_code == 401
    assert httpx.post(node.public + PATH, content=body, timeout=30).status_code != 200
    for bad in (b"{}", b'{"to_txid": "2"}', b'{"to_txid": true}', b"[2]", b'{"to_txid": 9}'):
        answer = signed(node, bad)
        assert answer.status_code == 400, (bad, answer.text)
        assert answer.json()["outcome"] == "not_run"
    too_big = signed(node, b'{"to_txid": 2' + b" " * 300 + b"}")
    assert too_big.status_code == 413
    assert cell.get("x") == 3

    answer = signed(node, body)
    assert answer.status_code == 200, answer.text
    assert answer.json() == {
        "rolled_back": [{"cell": "Counter:a", "to_txid": 2, "txid": 5, "undo_txid": 4}]
    }
    assert cell.get("x") == 1


def test_cellactors_rollback_prints_how_to_undo_it(
    node: ServedNode, bucket: S3Bucket, seaweed: SeaweedServer
) -> None:
    cell = node.node.cell(Counter, "a")
    cell.increment("x")
    cell.increment("x")
    back = cli(bucket, seaweed, node.internal, "--to-txid", "1")
    assert back.exit_code == 0, back.output
    assert back.stdout.strip() == (
        "rolled Counter:a back to txid 1 as txid 4; to undo it: "
        "cellactors rollback --cell Counter:a --to-txid 3"
    )
    assert cell.get("x") == 0
    undo = cli(bucket, seaweed, node.internal, "--to-txid", "3")
    assert undo.exit_code == 0, undo.output
    assert cell.get("x") == 2

    refused = cli(bucket, seaweed, node.internal, "--to-txid", "99")
    assert refused.exit_code != 0 and "bad_request" in refused.output
    both = cli(bucket, seaweed, node.internal, "--to-txid", "1", "--at-time", "2025-01-01")
    assert both.exit_code == 2
    assert cell.get("x") == 2
