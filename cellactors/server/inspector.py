"""The inspector's data routes on the internal listener, next to the fleet page.

``GET /history``: this node's figures over the last minutes (:mod:`cellactors.core.history`,
kept by :mod:`cellactors.actors.node.history`); ``GET /history?scope=fleet``: those of
every live node in ``/fleet`` added up, each peer's read from its own internal listener.
Both show only counts and latencies, so they are as open as ``/metrics``.

``GET /inspect/cells/{cls}/{name}`` (``?table=&offset=&limit=``): one cell's tables and a
page of rows, alarm, schedules, outbox and dead letters
(:mod:`cellactors.actors.node.inspection`); ``GET /inspect/cells/{cls}/{name}/changes``
(``?after=``): its latest acknowledged transactions from the bucket. Row data is the
application's, so both need a caller holding the ``admin`` role, authenticated by the
node's scheme (``Authorization: Bearer``); a node without a scheme shows them to no one.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.to_thread
import httpx
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from cellactors.actors.node import inspection
from cellactors.core import history, keys
from cellactors.errors import BadRequest, CallError, RemoteOwner
from cellactors.server.auth.admission import admit_admin
from cellactors.server.handling import NODE_HEADER, Core, as_call_error

#: Seconds a peer's ``/history`` may take before the fleet's figures leave it out.
PEER_TIMEOUT_S = 2.0
#: How many of the latest transactions the cell view's change list shows.
RECENT_CHANGES = 20
INSPECT_ROUTE = "/inspect/cells/{cls_name}/{name}"


class Inspector:
    """The routes above, over one internal app's core; ``fleet`` is the app's (cached)
    reading of the node leases."""

    def __init__(self, core: Core, fleet: Callable[[], Awaitable[dict[str, Any]]]) -> None:
        self.core = core
        self.fleet = fleet

    @property
    def _node(self) -> Any:
        return self.core.node

    def _headers(self) -> dict[str, str]:
        return {NODE_HEADER: self._node.node_id, "Cache-Control": "no-store"}

    # --- history --------------------------------------------------------------------------

    async def history(self, request: Request) -> Response:
        own: dict[str, Any] = self._node.history.view()
        if request.query_params.get("scope") != "fleet":
            return JSONResponse(own, headers=self._headers())
        try:
            fleet = await self.fleet()
        except Exception as e:
            return self.core.error(as_call_error(e), "json")
        peers = [
            n for n in fleet["nodes"] if n.get("alive") and not n.get("self") and n.get("addr")
        ]
        found: dict[str, list[dict[str, Any]]] = {own["node"]: own["points"]}
        missing: list[str] = []

        async def read(client: httpx.AsyncClient, peer: dict[str, Any]) -> None:
            try:
                answer = await client.get(f"http://{peer['addr']}/history")
                answer.raise_for_status()
                found[peer["node"]] = answer.json()["points"]
            except (httpx.HTTPError, ValueError, KeyError):
                missing.append(peer["node"])

        client = httpx.AsyncClient(timeout=PEER_TIMEOUT_S)
        async with client, anyio.create_task_group() as group:
            for peer in peers:
                group.start_soon(read, client, peer)
        bounds = own["bounds_s"]
        merged = [history.derive(p, bounds) for p in history.merge(found.values())]
        body = {
            "scope": "fleet",
            "node": own["node"],
            "nodes": sorted(found),
            "missing": sorted(missing),
            "step_s": own["step_s"],
            "bounds_s": bounds,
            "points": merged,
        }
        return JSONResponse(body, headers=self._headers())

    # --- cell view ------------------------------------------------------------------------

    def _admit(self, request: Request) -> None:
        """Refuse anyone but an authenticated ``admin`` (row data is never open by default)."""
        admit_admin(self.core.settings.authentication, request.headers, "the cell view")

    async def _guarded(self, request: Request, read: Callable[[str, str], Any]) -> Response:
        cls_name = request.path_params["cls_name"]
        name = request.path_params["name"]
        try:
            self._admit(request)
            keys.make_cell_id(cls_name, name)
            result = await anyio.to_thread.run_sync(read, cls_name, name)
        except RemoteOwner as owner:
            body = {
                "error": owner.code,
                "message": str(owner),
                "retryable": False,
                "node": owner.node,
                "addr": owner.addr,
            }
            return JSONResponse(body, status_code=409, headers=self._headers())
        except Exception as e:
            err: CallError = as_call_error(e)
            return self.core.error(err, "json")
        return JSONResponse(result, headers=self._headers())

    async def cell(self, request: Request) -> Response:
        q = request.query_params
        try:
            offset = int(q.get("offset", "0"))
            limit = int(q.get("limit", str(inspection.DEFAULT_ROWS)))
        except ValueError:
            return self.core.error(BadRequest("offset and limit are integers"), "json")
        table = q.get("table") or None
        node = self._node
        return await self._guarded(
            request,
            lambda cls, name: inspection.cell_view(node, cls, name, table, offset, limit),
        )

    async def changes(self, request: Request) -> Response:
        try:
            after = int(request.query_params.get("after", "0"))
        except ValueError:
            return self.core.error(BadRequest("after is an integer"), "json")
        node = self._node

        def read(cls: str, name: str) -> dict[str, Any]:
            changes = [c.to_wire() for c in node.changes(cls, name, max(0, after))]
            return {"after": after, "changes": changes[-RECENT_CHANGES:]}

        return await self._guarded(request, read)

    def routes(self) -> list[Route]:
        return [
            Route("/history", self.history, methods=["GET"]),
            Route(INSPECT_ROUTE, self.cell, methods=["GET"]),
            Route(INSPECT_ROUTE + "/changes", self.changes, methods=["GET"]),
        ]
