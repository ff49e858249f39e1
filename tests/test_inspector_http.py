"""The inspector's data routes on the internal listener of real nodes sharing a SeaweedFS
bucket: ``/history`` (one node's and the fleet's figures) and the cell view
(``/inspect/cells/...``: pages of rows, refusals, nothing written). The page in a browser
is tests/browser/test_inspector_page.py."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cellactors.core import history
from cellactors.persistence.store.s3 import S3Bucket
from cellactors.server.app import ServerSettings
from cellactors.server.auth import ApiKeys, Authentication
from tests.helpers.served import ServedNode, served_node

ADMIN = "ak_admin_0123456789abcdef"
USER = "ak_user_0123456789abcdef0"
KEYS = {
    ADMIN: {"principal": "ops", "roles": ["admin"]},
    USER: {"principal": "someone", "roles": ["user"]},
}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=30) as client:
        yield client


@pytest.fixture
def keyed(tmp_path: Path) -> ServerSettings:
    path = tmp_path / "keys.json"
    path.write_text(json.dumps(KEYS))
    return ServerSettings(authentication=Authentication([ApiKeys(path)]))


def increment(http: httpx.Client, via: ServedNode, cell: str, name: str) -> None:
    answer = http.post(
        f"{via.public}/cells/Counter/{cell}/increment", json={"name": name}, headers=bearer(ADMIN)
    )
    assert answer.status_code == 200, answer.text


def future_step() -> int:
    """A step end a minute ahead: the sampler threads' own samples before it are refused,
    so the test decides the intervals."""
    return history.step_end(int(time.time() * 1000)) + 60_000


def bucket_total(served: ServedNode) -> int:
    return sum(served.node.bucket.outcomes().values())


def test_history_counts_the_calls_and_bucket_requests_of_an_interval(
    sw_bucket: S3Bucket, http: httpx.Client, keyed: ServerSettings
) -> None:
    with served_node(sw_bucket, "ha", keyed) as a:
        t0 = future_step()
        assert a.node.history.sample(t0)
        before = bucket_total(a)
        for name in ("x", "y", "z"):
            increment(http, a, "h1", name)
        requests = bucket_total(a) - before
        assert a.node.history.sample(t0 + 5000)
        view = http.get(a.internal + "/history").json()
        assert view["node"] == "ha" and view["step_s"] == history.STEP_S
        last = view["points"][-1]
        assert (last["t_ms"], last["seconds"], last["calls"], last["errors"]) == (
            t0 + 5000,
            5.0,
            3,
            0,
        )
        assert last["bucket"] == requests > 0
        assert last["calls_per_s"] == pytest.approx(0.6)
        assert sum(last["call_hist"]) == 3 and last["call_p50_ms"] is not None
        assert sum(last["ack_hist"]) >= 3 and last["ack_p99_ms"] is not None


def test_fleet_history_adds_up_every_live_node(
    sw_bucket: S3Bucket, http: httpx.Client, keyed: ServerSettings
) -> None:
    with served_node(sw_bucket, "hb", keyed) as a, served_node(sw_bucket, "hc", keyed) as b:
        t0 = future_step()
        assert a.node.history.sample(t0) and b.node.history.sample(t0)
        increment(http, a, "f1", "x")  # owned by hb
        increment(http, b, "f2", "x")  # owned by hc
        increment(http, b, "f3", "x")
        assert a.node.history.sample(t0 + 5000) and b.node.history.sample(t0 + 5000)
        fleet = http.get(a.internal + "/history?scope=fleet").json()
        assert fleet["scope"] == "fleet" and fleet["nodes"] == ["hb", "hc"]
        assert fleet["missing"] == []
        last = fleet["points"][-1]
        assert (last["t_ms"], last["nodes"]) == (t0 + 5000, 2)
        own = http.get(a.internal + "/history").json()["points"][-1]
        peer = http.get(b.internal + "/history").json()["points"][-1]
        assert last["calls"] == own["calls"] + peer["calls"] >= 3
        assert last["bucket"] == own["bucket"] + peer["bucket"]


def view(
    http: httpx.Client, served: ServedNode, cell: str, key: str | None = ADMIN, **query: Any
) -> httpx.Response:
    headers = bearer(key) if key else {}
    return http.get(
        f"{served.internal}/inspect/cells/Counter/{cell}", params=query, headers=headers
    )


def test_the_cell_view_pages_through_rows_and_writes_nothing(
    sw_bucket: S3Bucket, http: httpx.Client, keyed: ServerSettings
) -> None:
    with served_node(sw_bucket, "hd", keyed) as d:
        for name in ("a", "b", "c"):
            increment(http, d, "v1", name)
        puts = d.node.bucket.snapshot()["put", "batch"]
        first = view(http, d, "v1", table="counts", limit=2)
        assert first.status_code == 200, first.text
        body = first.json()
        assert body["cell"] == "Counter:v1" and body["txid"] >= 3
        assert {"name": "counts", "rows": 3} in body["tables"]
        page = body["table"]
        assert page["columns"] == ["name", "n"]
        assert page["rows"] == [["a", 1], ["b", 1]] and page["more"] is True
        rest = view(http, d, "v1", table="counts", limit=2, offset=2).json()["table"]
        assert rest["rows"] == [["c", 1]] and rest["more"] is False
        assert body["alarm"] is None and body["outbox"] == [] and body["dead_letters"] == []
        again = view(http, d, "v1", table="counts").json()
        assert again["txid"] == body["txid"]  # looking commits no transaction
        assert d.node.bucket.snapshot()["put", "batch"] == puts

        changes = http.get(
            f"{d.internal}/inspect/cells/Counter/v1/changes",
            params={"after": 1},
            headers=bearer(ADMIN),
        )
        assert changes.status_code == 200, changes.text
        assert [c["txid"] for c in changes.json()["changes"]][-2:] == [
            body["txid"] - 1,
            body["txid"],
        ]

        assert view(http, d, "v1", table="nope").status_code == 400
        assert view(http, d, "v1", limit=0).status_code == 400
        assert view(http, d, "v1", limit=10_000).status_code == 400


def test_a_cell_never_written_is_not_created_by_looking(
    sw_bucket: S3Bucket, http: httpx.Client, keyed: ServerSettings
) -> None:
    with served_node(sw_bucket, "he", keyed) as e:
        before = e.node.bucket.snapshot()
        answer = view(http, e, "nobody")
        assert answer.status_code == 404 and answer.json()["error"] == "unknown_cell"
        spent = e.node.bucket.snapshot() - before
        # One GET of its ownership record; no write (a lease renewal may happen meanwhile).
        assert spent["get", "own"] == 1
        assert not [k for k in spent if k[0] != "get" and k[1] != "lease"]
        assert "Counter:nobody" not in {cid for cid, _ in e.node.activations.resident()}


def test_the_cell_view_is_for_authenticated_admins_only(
    sw_bucket: S3Bucket, http: httpx.Client, keyed: ServerSettings
) -> None:
    with served_node(sw_bucket, "hf", keyed) as f:
        increment(http, f, "s1", "secret")
        anonymous = view(http, f, "s1", key=None)
        assert anonymous.status_code == 401 and anonymous.json()["error"] == "unauthenticated"
        user = view(http, f, "s1", key=USER)
        assert user.status_code == 403 and user.json()["error"] == "forbidden"
        changes = http.get(f"{f.internal}/inspect/cells/Counter/s1/changes", headers=bearer(USER))
        assert changes.status_code == 403
        assert "secret" not in anonymous.text + user.text + changes.text
    # A node without an authentication scheme shows rows to no one.
    with served_node(sw_bucket, "hg") as g:
        increment(http, g, "s2", "x")
        refused = view(http, g, "s2", key=None)
        assert refused.status_code == 403
        assert "authentication scheme" in refused.json()["message"]
