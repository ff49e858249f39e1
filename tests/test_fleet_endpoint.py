"""``GET /fleet`` and the fleet page's files on the internal listener of real nodes sharing a
SeaweedFS bucket (the page in a browser is tests/browser)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from cellactors.errors import BucketError
from cellactors.persistence.store.s3 import S3Bucket
from cellactors.server.app import ServerSettings, build_internal_app
from tests.helpers.runtime import eventually
from tests.helpers.served import KEY, served_node


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=30) as client:
        yield client


def by_node(fleet: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n["node"]: n for n in fleet["nodes"]}


def fleet_when(
    http: httpx.Client, base: str, ready: Callable[[dict[str, dict[str, Any]]], bool]
) -> dict[str, Any]:
    """Poll ``base``'s ``/fleet`` until ``ready(nodes by id)``; that answer."""

    def poll() -> dict[str, Any] | bool:
        fleet: dict[str, Any] = http.get(base + "/fleet").json()
        return fleet if ready(by_node(fleet)) else False

    answer = eventually(poll)
    assert isinstance(answer, dict)
    return answer


def test_fleet_lists_every_lease_alive_then_released(
    sw_bucket: S3Bucket, http: httpx.Client
) -> None:
    with served_node(sw_bucket, "fa") as a:
        with served_node(sw_bucket, "fb") as b:
            assert http.post(f"{b.public}/cells/Counter/z/increment", json={"name": "x"}).is_success
            # b's load reaches its lease at its next renewal.
            fleet = fleet_when(
                http, a.internal, lambda n: n["fb"]["load"].get("resident_cells") == 1
            )
            assert fleet["node"] == "fa"
            nodes = by_node(fleet)
            assert sorted(nodes) == ["fa", "fb"]
            assert nodes["fa"]["self"] and not nodes["fb"]["self"]
            assert nodes["fa"]["alive"] and nodes["fb"]["alive"]
            assert nodes["fb"]["addr"] == f"127.0.0.1:{b.internal_port}"
            assert nodes["fb"]["generation"] == b.node.generation
            assert nodes["fb"]["expires_ms"] > fleet["now_ms"]
        # b drained: its lease now says expires_ms = 0, so a shows it as not alive.
        gone = by_node(fleet_when(http, a.internal, lambda n: n["fb"]["alive"] is False))
        assert gone["fb"]["expires_ms"] == 0
        assert gone["fa"]["alive"]


def test_fleet_reads_the_bucket_at_most_once_per_cache_period(
    sw_bucket: S3Bucket, http: httpx.Client
) -> None:
    with served_node(sw_bucket, "fc", ServerSettings(fleet_cache_seconds=3600)) as c:
        lists = c.node.bucket.snapshot()[("list", "lease")]
        answers = [http.get(c.internal + "/fleet").json() for _ in range(3)]
        assert c.node.bucket.snapshot()[("list", "lease")] == lists + 1
        assert answers[0] == answers[1] == answers[2]
    with served_node(sw_bucket, "fd", ServerSettings(fleet_cache_seconds=0)) as d:
        lists = d.node.bucket.snapshot()[("list", "lease")]
        for _ in range(3):
            assert http.get(d.internal + "/fleet").status_code == 200
        assert d.node.bucket.snapshot()[("list", "lease")] == lists + 3


class _FailingFleetNode:
    node_id = "broken"
    generation = "g"
    status = "serving"
    classes: dict[str, type] = {}

    def fleet(self) -> dict[str, Any]:
        raise BucketError("the store is down")


def test_fleet_answers_503_when_the_bucket_fails() -> None:
    app = build_internal_app(_FailingFleetNode(), KEY)  # type: ignore[arg-type]

    async def get() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            return await client.get("/fleet")

    answer = asyncio.run(get())
    assert answer.status_code == 503
    assert answer.json() == {
        "error": "bucket_unavailable",
        "message": "could not read the node leases: the store is down",
        "outcome": "not_run",
        "retryable": True,
    }


def test_page_files_are_served_with_a_strict_policy(
    sw_bucket: S3Bucket, http: httpx.Client
) -> None:
    with served_node(sw_bucket, "fe") as e:
        index = http.get(e.internal + "/")
        script = http.get(e.internal + "/page/page.js")
        style = http.get(e.internal + "/page/page.css")
        missing = http.get(e.internal + "/page/app.py")
        traversal = http.get(e.internal + "/page/..%2F..%2Fapp.py")
        public = http.get(e.public + "/")
    assert index.status_code == 200
    assert index.headers["content-type"] == "text/html; charset=utf-8"
    assert '<script src="/page/page.js" defer></script>' in index.text
    policy = index.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "default-src 'none'" in policy
    assert index.headers["x-content-type-options"] == "nosniff"
    assert script.status_code == 200 and script.headers["content-type"].startswith(
        "text/javascript"
    )
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
        assert sink not in script.text  # server data never becomes markup or code
    assert style.status_code == 200 and style.headers["content-type"].startswith("text/css")
    assert missing.status_code == 404 and missing.json()["error"] == "not_found"
    assert traversal.status_code == 404
    assert public.status_code == 404  # the public listener has no page
