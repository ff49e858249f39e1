"""Dead letters over the internal listener and through ``cellactors dead-letters``: real
nodes served by the real runner on loopback, one SeaweedFS bucket holding the fleet key the
requests are signed with."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner, Result

from cellactors.cli import main
from cellactors.persistence.store.embedded import SeaweedServer
from cellactors.persistence.store.s3 import S3Bucket
from cellactors.server import signing
from tests.helpers.alarm_cells import Account, Payer
from tests.helpers.runtime import eventually
from tests.helpers.served import KEY, ServedNode, served_node, with_fleet_key

CELL = "Payer:p"


@pytest.fixture
def bucket(sw_bucket: S3Bucket) -> S3Bucket:
    """A bucket holding the fleet key the served nodes sign with (``serve`` writes it)."""
    with_fleet_key(sw_bucket)
    return sw_bucket


@pytest.fixture
def node(bucket: S3Bucket) -> Iterator[ServedNode]:
    with served_node(bucket, "na", classes=[Payer], outbox_max_attempts=2) as served:
        yield served


def typo(served: ServedNode, to: str = "bob") -> str:
    """Send a payment whose class no node serves yet; wait until it is a dead letter."""
    [sent] = served.node.cell(Payer, "p").pay(to=to, amounts=[9])
    assert isinstance(sent, str)
    eventually(lambda: sent in [x.id for x in served.node.dead_letters(Payer, "p")], timeout=15)
    return sent


def signed(served: ServedNode, method: str, suffix: str = "") -> httpx.Response:
    path = f"/cells/Payer/p/dead-letters{suffix}"
    headers = signing.sign_request(
        KEY,
        method,
        path,
        b"",
        source="operator",
        target=served.node.node_id,
        target_generation=served.node.generation,
    )
    return httpx.request(method, served.internal + path, headers=headers, timeout=30)


def cli(bucket: S3Bucket, seaweed: SeaweedServer, url: str, *args: str) -> Result:
    store = ["--bucket", f"s3://{bucket.bucket}", "--endpoint", seaweed.endpoint]
    command, *rest = args
    return CliRunner().invoke(
        main, ["dead-letters", command, *store, "--node", url, "--cell", CELL, *rest]
    )


def test_the_internal_listener_lists_retries_and_purges_signed_requests_only(
    node: ServedNode,
) -> None:
    sent = typo(node)
    assert httpx.get(node.internal + "/cells/Payer/p/dead-letters").status_code == 401
    # The public listener has no such route (only the call route, POST, matches the path).
    assert httpx.get(node.public + "/cells/Payer/p/dead-letters").status_code == 405
    listed = signed(node, "GET")
    assert listed.status_code == 200, listed.text
    [letter] = listed.json()["dead_letters"]
    assert (letter["id"], letter["target"], letter["method"]) == (sent, "Account:bob", "deposit")
    assert letter["kwargs"] == {"amount": 9}
    assert letter["code"] == "unknown_cell" and letter["attempts"] == 2
    assert "Account" in letter["reason"]
    missing = signed(node, "POST", "/outbox.nope/retry")
    assert missing.status_code == 404
    assert missing.json()["error"] == "dead_letter_not_found"
    node.node.register(Account)  # deployed: a retry delivers it
    retried = signed(node, "POST", f"/{sent}/retry")
    assert retried.status_code == 200 and retried.json() == {"retried": [sent]}
    eventually(lambda: node.node.cell(Account, "bob").credits() == [9], timeout=15)
    assert signed(node, "GET").json() == {"dead_letters": []}
    gone = signed(node, "DELETE", f"/{sent}")
    assert gone.status_code == 404  # delivered: no longer a dead letter
    assert signed(node, "DELETE").json() == {"purged": []}


def test_the_command_lists_retries_and_purges(
    node: ServedNode, bucket: S3Bucket, seaweed: SeaweedServer
) -> None:
    first, second = typo(node, "bob"), typo(node, "carol")
    listed = cli(bucket, seaweed, node.internal, "list")
    assert listed.exit_code == 0, listed.output
    rows = [json.loads(line) for line in listed.output.splitlines()]
    assert [r["id"] for r in rows] == [first, second]
    assert cli(bucket, seaweed, node.internal, "purge").exit_code == 2  # --all or --id
    node.node.register(Account)
    retried = cli(bucket, seaweed, node.internal, "retry", "--id", first)
    assert retried.exit_code == 0, retried.output
    assert retried.output.split() == [first]
    eventually(lambda: node.node.cell(Account, "bob").credits() == [9], timeout=15)
    purged = cli(bucket, seaweed, node.internal, "purge", "--all")
    assert purged.exit_code == 0, purged.output
    assert purged.output.split() == [second]
    assert cli(bucket, seaweed, node.internal, "list").output == ""
    again = cli(bucket, seaweed, node.internal, "retry", "--id", first)
    assert again.exit_code == 1
    assert "dead_letter_not_found" in again.output
    assert node.node.cell(Account, "carol").credits() == []


def test_a_node_that_does_not_own_the_sender_points_to_its_owner(
    node: ServedNode, bucket: S3Bucket, seaweed: SeaweedServer
) -> None:
    sent = typo(node)
    with served_node(bucket, "nb", classes=[Payer]) as other:
        answer = signed(other, "GET")
        assert answer.status_code == 409
        body: dict[str, Any] = answer.json()
        assert (body["error"], body["node"], body["outcome"]) == ("remote_owner", "na", "not_run")
        assert body["addr"] == node.internal.removeprefix("http://")
        listed = cli(bucket, seaweed, other.internal, "list")  # follows to the owner
        assert listed.exit_code == 0, listed.output
        assert [json.loads(line)["id"] for line in listed.output.splitlines()] == [sent]


def test_the_command_signs_with_the_nodes_keyring_when_they_use_one(
    sw_bucket: S3Bucket, seaweed: SeaweedServer, tmp_path: Path
) -> None:
    """Nodes given --peer-key-file write no fleet key to the bucket: the command signs with
    the same keyring, given as the same flag."""
    ring = tmp_path / "peer.keys"
    ring.write_text(KEY.hex() + "\n")
    with served_node(sw_bucket, "nk", classes=[Payer], outbox_max_attempts=2) as served:
        letter = typo(served)
        without = cli(sw_bucket, seaweed, served.internal, "list")
        assert without.exit_code != 0 and "no fleet key" in without.output
        listed = cli(sw_bucket, seaweed, served.internal, "list", "--peer-key-file", str(ring))
        assert listed.exit_code == 0, listed.output
        assert [json.loads(line)["id"] for line in listed.output.splitlines()] == [letter]
