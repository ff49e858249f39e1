"""The public listener's admin routes (``DELETE /admin/cells/...``, ``POST
/admin/cells/.../rollback``): only an authenticated ``admin`` is obeyed, a node without an
authentication scheme refuses everyone, and a node that does not own the cell hands the
request to the owner, signed."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cellactors.core import keys
from cellactors.persistence.store.s3 import S3Bucket
from cellactors.server.app import ServerSettings
from cellactors.server.auth import ApiKeys, Authentication
from cellactors.server.cell_admin import _without_addresses
from tests.helpers.cells import Counter
from tests.helpers.served import served_node, with_fleet_key

ADMIN = {"Authorization": "Bearer ak_admin_0123456789abcdef"}
USER = {"Authorization": "Bearer ak_user_0123456789abcdef0"}
ROLLBACK = "/admin/cells/Counter/a/rollback"


@pytest.fixture
def bucket(sw_bucket: S3Bucket) -> S3Bucket:
    with_fleet_key(sw_bucket)
    return sw_bucket


@pytest.fixture
def keyed(tmp_path: Path) -> ServerSettings:
    path = tmp_path / "keys.json"
    path.write_text(
        json.dumps(
            {
                ADMIN["Authorization"][7:]: {"principal": "ops", "roles": ["admin"]},
                USER["Authorization"][7:]: {"principal": "someone", "roles": ["user"]},
            }
        )
    )
    return ServerSettings(authentication=Authentication([ApiKeys(path)]))


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=30) as client:
        yield client


def test_only_an_admin_rolls_back_or_purges(
    bucket: S3Bucket, keyed: ServerSettings, http: httpx.Client
) -> None:
    with served_node(bucket, "na", keyed) as node:
        cell = node.node.cell(Counter, "a")
        cell.increment("x")
        cell.increment("x")  # txid 3
        point = {"to_txid": 2}
        assert http.post(node.public + ROLLBACK, json=point).status_code == 401
        assert http.post(node.public + ROLLBACK, json=point, headers=USER).status_code == 403
        bad = http.post(node.public + ROLLBACK, json={"to_txid": "2"}, headers=ADMIN)
        assert bad.status_code == 400
        unknown = http.post(node.public + "/admin/cells/Nope/a/rollback", json=point, headers=ADMIN)
        assert unknown.status_code == 404
        assert http.delete(node.public + "/admin/cells/Counter/a", headers=USER).status_code == 403
        assert cell.get("x") == 2

        answer = http.post(node.public + ROLLBACK, json=point, headers=ADMIN)
        assert answer.status_code == 200, answer.text
        assert answer.json()["rolled_back"][0]["undo_txid"] == 3
        assert cell.get("x") == 1

        gone = http.delete(node.public + "/admin/cells/Counter/a", headers=ADMIN)
        assert gone.status_code == 200, gone.text
        assert gone.json()["purged"][0]["cell"] == "Counter:a"
        assert list(bucket.list(keys.cell_root("Counter:a"))) == []
        assert cell.get("x") == 0


def test_a_node_without_authentication_refuses_everyone(
    bucket: S3Bucket, http: httpx.Client
) -> None:
    with served_node(bucket, "na") as node:
        node.node.cell(Counter, "a").increment("x")
        refused = http.post(node.public + ROLLBACK, json={"to_txid": 1})
        assert refused.status_code == 403
        assert "no authentication scheme" in refused.json()["message"]
        assert http.delete(node.public + "/admin/cells/Counter/a").status_code == 403
        assert node.node.cell(Counter, "a").get("x") == 1


def test_a_node_that_does_not_own_the_cell_hands_the_request_to_its_owner(
    bucket: S3Bucket, keyed: ServerSettings, http: httpx.Client
) -> None:
    with served_node(bucket, "owner", keyed) as owner, served_node(bucket, "other", keyed) as other:
        cell = owner.node.cell(Counter, "a")
        cell.increment("x")
        cell.increment("x")
        answer = http.post(other.public + ROLLBACK, json={"to_txid": 2}, headers=ADMIN)
        assert answer.status_code == 200, answer.text
        assert answer.headers["x-cellactors-node"] == "owner"
        assert cell.get("x") == 1
        assert other.node.resident_cells() == 0  # it never activated the cell


def test_an_owners_refusal_reaches_a_public_caller_without_internal_addresses() -> None:
    refusal = json.dumps({"error": "remote_owner", "node": "n2", "addr": "10.0.3.17:8081"})
    assert json.loads(_without_addresses(refusal.encode())) == {
        "error": "remote_owner",
        "node": "n2",
    }
    assert _without_addresses(b"not json") == b"not json"
