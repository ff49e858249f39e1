"""An operator's changes to a whole cell on the public listener, for an authenticated
``admin`` (refused on a node without an authentication scheme):

- ``DELETE /admin/cells/{cls}/{name}``: purge the cell (:mod:`cellactors.actors.node.purging`);
- ``POST /admin/cells/{cls}/{name}/rollback`` with ``{"to_txid": N}`` or ``{"at_ms": T}``:
  roll it back in place (:mod:`cellactors.actors.node.rolling_back`).

A cell a live peer owns is handed to that peer's internal listener as the operator request
the internal routes take (``DELETE /cells/{cls}/{name}``, ``POST .../rollback``), signed
with the fleet key, and its answer is passed through. The answers are those of the internal
routes: ``{"purged": [...]}`` and ``{"rolled_back": [...]}``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import httpx
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from cellactors.actors.node.node import Node
from cellactors.actors.node.purging import purge
from cellactors.actors.node.rolling_back import roll_back
from cellactors.core import keys
from cellactors.errors import BadRequest, InternalError, RemoteOwner, UnknownCell
from cellactors.server import signing
from cellactors.server.auth.admission import admit_admin
from cellactors.server.forward import base_url, lost, unreachable
from cellactors.server.handling import NODE_HEADER, Core, as_call_error
from cellactors.wire import codec
from cellactors.wire.unsent import NOT_SENT

log = logging.getLogger("cellactors.server")

ADMIN_CELL_ROUTE = "/admin/cells/{cls_name}/{name}"
#: The largest body a rollback request may have (one small JSON object).
ROLLBACK_BODY_LIMIT = 256


def rollback_point(body: bytes) -> dict[str, int]:
    """The point a rollback request names: ``{"to_txid": N}`` or ``{"at_ms": T}``."""
    try:
        value = json.loads(body or b"null")
    except ValueError:
        value = None
    if (
        not isinstance(value, dict)
        or len(value) != 1
        or not set(value) <= {"to_txid", "at_ms"}
        or type(next(iter(value.values()))) is not int
    ):
        raise BadRequest('a rollback names one point: {"to_txid": N} or {"at_ms": T} (integers)')
    return {str(k): int(v) for k, v in value.items()}


def purge_here(node: Any, cls_name: str, name: str) -> list[Any]:
    """Purge through ``node`` (a :class:`~cellactors.actors.node.node.Node`)."""
    if not isinstance(node, Node):
        raise InternalError("this node cannot purge cells")
    return [asdict(purge(node, cls_name, name))]


def roll_back_here(node: Any, cls_name: str, name: str, point: dict[str, int]) -> list[Any]:
    """Roll back through ``node`` to ``point`` (:func:`rollback_point`)."""
    if not isinstance(node, Node):
        raise InternalError("this node cannot roll cells back")
    return [roll_back(node, cls_name, name, **point).to_dict()]


def _without_addresses(content: bytes) -> bytes:
    """An owner's error answer without the internal address it may name (``remote_owner``):
    the public listener never tells its callers where the internal listeners are."""
    try:
        payload = json.loads(content)
    except ValueError:
        return content
    if not isinstance(payload, dict) or "addr" not in payload:
        return content
    payload.pop("addr")
    return json.dumps(payload).encode()


class CellAdmin:
    """The routes above, over the public app's core."""

    def __init__(self, core: Core, client: Callable[[], httpx.AsyncClient]) -> None:
        self.core = core
        self.client = client

    async def purge(self, request: Request) -> Response:
        return await self._act(request, "DELETE", "", "purged", "purge cells", 0)

    async def roll_back(self, request: Request) -> Response:
        return await self._act(
            request, "POST", "/rollback", "rolled_back", "roll cells back", ROLLBACK_BODY_LIMIT
        )

    async def _act(
        self, request: Request, method: str, suffix: str, done: str, what: str, limit: int
    ) -> Response:
        cls_name = request.path_params["cls_name"]
        name = request.path_params["name"]
        node = self.core.node
        try:
            admit_admin(self.core.settings.authentication, request.headers, what)
            body = await codec.read_body(
                request.stream(), request.headers.get("content-length"), limit
            )
            if cls_name not in node.classes:
                raise UnknownCell(f"no served cell class {cls_name!r}")
            keys.make_cell_id(cls_name, name)
            if suffix:
                point = rollback_point(body)  # refused here, before any cell is activated
                result = await self.core.run(roll_back_here, node, cls_name, name, point)
            else:
                result = await self.core.run(purge_here, node, cls_name, name)
        except RemoteOwner as owner:
            return await self._hand_to(owner, method, cls_name, name, suffix, body)
        except Exception as e:
            return self.core.error(as_call_error(e), "json")
        return Response(
            codec.encode({done: result}, "json"),
            media_type=codec.CONTENT_TYPES["json"],
            headers={NODE_HEADER: node.node_id},
        )

    async def _hand_to(
        self, owner: RemoteOwner, method: str, cls_name: str, name: str, suffix: str, body: bytes
    ) -> Response:
        """The operator request for the owner's internal listener, signed, and its answer."""
        url_path, headers = signing.operator_request(
            self.core.key,
            method,
            keys.make_cell_id(cls_name, name),
            suffix,
            body,
            source=self.core.node.node_id,
            target=owner.node,
            target_generation=owner.generation,
        )
        try:
            peer = await self.client().request(
                method, base_url(owner.addr) + url_path, content=body, headers=headers
            )
        except NOT_SENT as e:
            return self.core.error(unreachable(owner, e), "json")
        except httpx.HTTPError as e:
            return self.core.error(lost(owner, e), "json")
        content = peer.content
        if not peer.is_success:
            log.warning("owner %s answered HTTP %d to %s", owner.node, peer.status_code, url_path)
            content = _without_addresses(content)
        return Response(
            content,
            status_code=peer.status_code,
            media_type=peer.headers.get("content-type"),
            headers={NODE_HEADER: owner.node},
        )

    def routes(self) -> list[Route]:
        return [
            Route(ADMIN_CELL_ROUTE, self.purge, methods=["DELETE"]),
            Route(ADMIN_CELL_ROUTE + "/rollback", self.roll_back, methods=["POST"]),
        ]
