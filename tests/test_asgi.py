"""The ASGI integration (cellactors/asgi.py) through the FastAPI example: two shop apps,
each running its own node on one bucket, called in process with httpx; a call through the
app whose node does not own the cart is forwarded, signed, to the owner's internal listener."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import FastAPI

from cellactors import Node, NodeSettings
from cellactors.actors.node.status import NodeStatus
from cellactors.asgi import node_lifespan
from cellactors.errors import NOT_RUN, UnknownMethod
from cellactors.persistence.store.s3 import S3Bucket
from examples.fastapi_shop import SHOP_TOKEN, build_app
from tests.helpers.cells import Counter
from tests.helpers.runtime import TTL
from tests.helpers.served import KEY, _bound_socket

AUTH = {"X-Shop-Token": SHOP_TOKEN}


def shop(bucket: S3Bucket, node_id: str) -> FastAPI:
    sock = _bound_socket()
    return build_app(
        bucket, node_id, KEY, ("127.0.0.1", sock.getsockname()[1]), sock, lease_ttl=TTL
    )


@contextlib.asynccontextmanager
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """The app started (its lifespan runs the node) and an in-process client on it."""
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://shop") as http:
            yield http


def test_routes_call_cells_and_forward_to_the_owner(sw_bucket: S3Bucket) -> None:
    async def scenario() -> None:
        a, b = shop(sw_bucket, "shop-a"), shop(sw_bucket, "shop-b")
        async with client(a) as on_a, client(b) as on_b:
            refused = await on_a.post("/carts/alice/apple")
            assert refused.status_code == 401  # the app's own dependency, before any cell
            first = await on_a.post("/carts/alice/apple", headers=AUTH)
            assert first.json() == {"cart": "alice", "sku": "apple", "count": 1}
            # shop-a owns Cart:alice now: shop-b's call is forwarded to it, not run on b.
            second = await on_b.post("/carts/alice/apple", headers=AUTH)
            assert second.json()["count"] == 2
            assert (await on_b.get("/carts/alice/apple", headers=AUTH)).json()["count"] == 2
            # The generic routes, mounted behind the shop's middleware, answer as a node.
            assert (
                await on_b.post("/api/cells/Cart/alice/count", json={"sku": "apple"})
            ).status_code == 401
            generic = await on_b.post(
                "/api/cells/Cart/alice/count", json={"sku": "apple"}, headers=AUTH
            )
            assert generic.json() == {"result": 2}
            assert generic.headers["X-Cellactors-Node"] == "shop-a"

    asyncio.run(scenario())


def test_acell_keys_and_errors_with_their_outcome(sw_bucket: S3Bucket) -> None:
    sock = _bound_socket()
    port = sock.getsockname()[1]
    settings = NodeSettings(lease_ttl=TTL, advertise=f"127.0.0.1:{port}")
    node = Node(sw_bucket, "solo", [Counter], settings)

    async def scenario() -> None:
        async with node_lifespan(node, KEY, ("127.0.0.1", port), sock=sock) as served:
            keyed = served.acell(Counter, "c", key="k-1")
            assert await keyed.increment(name="x") == 1
            assert await keyed.increment(name="x") == 1  # the same key: answered, not run again
            assert await served.acell("Counter", "c").increment(name="x") == 2
            with pytest.raises(UnknownMethod) as refused:
                await served.acell(Counter, "c").no_such_method()
            assert refused.value.outcome == NOT_RUN
        assert node.status == NodeStatus.STOPPED  # drained and stopped with the app

    asyncio.run(scenario())
