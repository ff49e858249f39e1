"""A FastAPI shop with cells behind it: its own token check, two routes calling a cart cell,
and the generic ``/api/cells/...`` routes mounted behind the same check (docs/web-apps.md).

    app = build_app(S3Bucket(...), "node-a", fleet_key, internal=("10.0.0.5", 8081))
    uvicorn.run(app, port=8000)
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, HTTPException, Request, Response

from cellactors import CellActor, Node, NodeSettings, read_only
from cellactors.asgi import FleetKey, Served, cells_app, node_lifespan
from cellactors.persistence.store.bucket import Bucket

#: The shop's own API token (a real shop checks its users' sessions here).
SHOP_TOKEN = "shop-secret"


class Cart(CellActor):
    """One shopper's cart: item counts."""

    def on_activate(self) -> None:
        self.db.execute("CREATE TABLE IF NOT EXISTS items (sku TEXT PRIMARY KEY, n INTEGER)")

    def add(self, sku: str, n: int = 1) -> int:
        """Add ``n`` of ``sku``; the new count."""
        self.db.execute(
            "INSERT INTO items VALUES (?, ?) ON CONFLICT(sku) DO UPDATE SET n = n + excluded.n",
            [sku, n],
        )
        return self.count(sku)

    @read_only
    def count(self, sku: str) -> int:
        """How many of ``sku`` are in the cart."""
        row = self.db.execute("SELECT n FROM items WHERE sku = ?", [sku]).fetchone()
        return int(row[0]) if row else 0


def shop_user(x_shop_token: Annotated[str | None, Header()] = None) -> str:
    """The shop's own authentication: a token header, checked before any cell is called."""
    if x_shop_token != SHOP_TOKEN:
        raise HTTPException(status_code=401, detail="bad shop token")
    return "shopper"


def build_app(
    bucket: Bucket,
    node_id: str,
    fleet_key: FleetKey,
    internal: tuple[str, int] = ("127.0.0.1", 8081),
    sock: socket.socket | None = None,
    **node_settings: Any,
) -> FastAPI:
    """The shop app, running node ``node_id`` on ``bucket`` for as long as the app runs;
    peers reach it on ``internal`` (advertised unless ``advertise`` is given; served on
    ``sock`` when one is bound already)."""
    node_settings.setdefault("advertise", f"{internal[0]}:{internal[1]}")
    node = Node(bucket, node_id, [Cart], NodeSettings(**node_settings))
    holder: dict[str, Served] = {}

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with node_lifespan(node, fleet_key, internal, sock=sock) as served:
            holder["served"] = served
            yield

    app = FastAPI(lifespan=lifespan)

    @app.middleware("http")
    async def guard_api(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        """The generic cell routes are behind the shop's token too."""
        if request.url.path.startswith("/api/") and (
            request.headers.get("x-shop-token") != SHOP_TOKEN
        ):
            return Response('{"detail":"bad shop token"}', 401, media_type="application/json")
        return await call_next(request)

    @app.post("/carts/{cart}/{sku}")
    async def add(cart: str, sku: str, user: Annotated[str, Depends(shop_user)]) -> dict[str, Any]:
        n = await holder["served"].acell(Cart, cart).add(sku=sku)
        return {"cart": cart, "sku": sku, "count": n}

    @app.get("/carts/{cart}/{sku}")
    async def count(
        cart: str, sku: str, user: Annotated[str, Depends(shop_user)]
    ) -> dict[str, Any]:
        n = await holder["served"].acell(Cart, cart).count(sku=sku)
        return {"cart": cart, "sku": sku, "count": n}

    app.mount("/api", cells_app(node, fleet_key))
    return app
