"""Pushes between nodes: an owner sends a cell's acknowledged pushes to the node holding
their sockets, signed for that node's process, at ``POST /internal/pushes``.

A holder whose process is not the one the socket was opened on refuses the signature as a
stale target: the owner learns its sockets there are gone (:class:`StaleRoute`). A request
that gets no answer is retried by the owner's sender, in order; the holder's cursors drop
whatever it already passed on.
"""

from __future__ import annotations

import logging
from typing import Any

import httpx
from starlette.requests import Request
from starlette.responses import Response

from cellactors.actors.sockets import from_wire
from cellactors.core import sockets
from cellactors.core.sockets import Delivery, Holder, Push
from cellactors.errors import NodeUnavailable, NotDurable, StaleRoute, error_from_answer
from cellactors.persistence.celldb import calls
from cellactors.server import forward, signing
from cellactors.server.handling import Core, as_call_error
from cellactors.server.peer_calls import PeerCaller
from cellactors.wire import codec

log = logging.getLogger(__name__)

PUSHES_ROUTE = "/internal/pushes"


def encode(delivery: Delivery) -> bytes:
    return calls.encode(
        {
            "cell": delivery.cell_id,
            "epoch": delivery.epoch,
            "prev": delivery.prev,
            "pushes": [[p.seq, list(p.conns), p.kind, p.data, p.code] for p in delivery.pushes],
        }
    )


def decode(body: bytes) -> Delivery:
    value = calls.decode(body)
    pushes: list[Push] = from_wire(value["pushes"])
    prev = value["prev"]
    return Delivery(
        str(value["cell"]), int(value["epoch"]), None if prev is None else int(prev), tuple(pushes)
    )


class PushSender:
    """Sends deliveries to holders over signed HTTP (the node's ``pushes.transport``), with
    the node's peer caller's keys, clock and connections."""

    def __init__(self, peer: PeerCaller) -> None:
        self.peer = peer

    def __call__(self, holder: Holder, delivery: Delivery) -> None:
        body = encode(delivery)
        peer = self.peer
        headers = signing.sign_request(
            peer.keys().signing,
            "POST",
            PUSHES_ROUTE,
            body,
            source=peer.node_id,
            target=holder.node,
            target_generation=holder.generation,
            now=peer.clock(),
        )
        url = forward.base_url(holder.addr) + PUSHES_ROUTE
        try:
            resp = peer.client().post(url, content=body, headers=headers)
        except httpx.HTTPError as err:
            raise NodeUnavailable(f"holder {holder.node} is unreachable: {err!r}") from err
        if resp.is_success:
            return
        payload = forward.error_payload(resp.content, resp.headers.get("content-type"))
        if payload is not None and payload.get("error") == "stale_target":
            raise StaleRoute(f"holder {holder.node} restarted: its sockets are gone")
        answer = error_from_answer(resp.status_code, payload)
        raise NotDurable(f"holder {holder.node} did not take the pushes: {answer}")


def install_push_sender(node: Any, peer: PeerCaller) -> None:
    """Give a node's push driver the signed sender (a node without one has no sockets)."""
    pushes = getattr(node, "pushes", None)
    if pushes is not None:
        pushes.transport = PushSender(peer)


async def receive_pushes(core: Core, nonces: signing.NonceCache, request: Request) -> Response:
    """A peer's delivery for sockets held here, once its signature names this process."""
    try:
        # The most a delivery weighs: its runs of pushes, one push past the run's budget,
        # and their sockets' ids (a generous allowance).
        limit = sockets.DELIVERY_BYTES + sockets.MAX_PUSH_BYTES + (4 << 20)
        body = await codec.read_body(request.stream(), request.headers.get("content-length"), limit)
        signing.verify_request(
            core.keys().accepted,
            "POST",
            request.scope["path"],
            body,
            request.headers,
            expected_target=core.node.node_id,
            expected_generation=core.node.generation,
            nonces=nonces,
            now=core.node.store_time(),
            window=core.settings.signature_window,
        )
        delivery = decode(body)
    except Exception as err:
        return core.error(as_call_error(err), "json")
    hub = getattr(getattr(core.node, "pushes", None), "hub", None)
    if hub is not None:
        hub.deliver(delivery)
    return Response(status_code=204)
