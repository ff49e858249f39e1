"""The signed forward of a call to the node that owns its cell: one for both paths that
forward, a client's call reaching a node that does not own the cell (the public listener,
asynchronous) and a call between cells (:mod:`.peer_calls`, synchronous).

Both build the request here (the owner's internal route, the fleet key's signature for the
owner's process generation, the idempotency key, the call chain and the trace context), and
both read the owner's refusals here: a signature for a process that has restarted since the
route was cached is a stale route (``not_run``: look the owner up again); any other refusal of the
signature is ``peer_refused`` (``not_run``: the fleet's key or clocks disagree). A request
that never left whole is ``node_unavailable`` (``not_run``), one sent without an answer
``not_durable`` (``unknown``). Whether a ``not_run`` answer may be routed once more is
:mod:`cellactors.core.routing`'s rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import cellactors.errors as errors
from cellactors.core import principal
from cellactors.core.principal import Principal
from cellactors.errors import CallError, NodeUnavailable, NotDurable, PeerRefused, StaleRoute
from cellactors.server import signing
from cellactors.wire import codec

#: The internal listener's route for forwarded calls.
INTERNAL_CELL_ROUTE = "/internal/cells/{cls_name}/{name}/{method}"
#: The header carrying the chain of cells waiting on a call between cells.
CHAIN_HEADER = "X-Cellactors-Chain"


def encode_chain(chain: tuple[str, ...]) -> str:
    """The header value: cell ids joined by commas (a cell id never holds a comma)."""
    return ",".join(chain)


def decode_chain(value: str | None) -> tuple[str, ...]:
    """The call chain a header carries (empty without one)."""
    if not value:
        return ()
    return tuple(part for part in value.split(",") if part)


def base_url(addr: str) -> str:
    """The owner's internal listener as a URL (its lease holds ``host:port``)."""
    addr = addr.rstrip("/")
    return addr if "://" in addr else f"http://{addr}"


@dataclass(frozen=True)
class Forward:
    """A forwarded call, ready to send: POST ``body`` to ``url`` with ``headers``."""

    url: str
    headers: dict[str, str]
    body: bytes


def signed(
    key: bytes,
    source: str,
    owner: errors.RemoteOwner,
    cls_name: str,
    name: str,
    method: str,
    body: bytes,
    encoding: codec.Encoding,
    *,
    idempotency_key: str | None,
    now: float,
    chain: tuple[str, ...] = (),
    caller: Principal | None = None,
    trace: str = "",
) -> Forward:
    """The call signed by ``source`` for ``owner``'s current process, at store time ``now``;
    ``trace`` is the ``traceparent`` of the sender's span (signed too), empty when it does
    not trace."""
    path = INTERNAL_CELL_ROUTE.format(cls_name=cls_name, name=name, method=method)
    headers = signing.sign_request(
        key,
        "POST",
        path,
        body,
        source=source,
        target=owner.node,
        target_generation=owner.generation,
        idempotency_key=idempotency_key,
        now=now,
        caller=principal.encode(caller),
        trace=trace,
    )
    headers["Content-Type"] = codec.CONTENT_TYPES[encoding]
    if chain:
        headers[CHAIN_HEADER] = encode_chain(chain)
    quoted = "/".join(quote(part, safe="") for part in (cls_name, name, method))
    return Forward(base_url(owner.addr) + "/internal/cells/" + quoted, headers, body)


def unreachable(owner: errors.RemoteOwner, err: BaseException) -> NodeUnavailable:
    """The error of a forward that never left whole: it ran nowhere."""
    return NodeUnavailable(f"owner {owner.node} at {owner.addr} is unreachable: {err!r}")


def lost(owner: errors.RemoteOwner, err: BaseException) -> NotDurable:
    """The error of a forward sent (maybe in part) that got no answer: it may have run."""
    return NotDurable(f"forwarded call to {owner.node} has an unknown outcome: {err!r}")


def error_payload(content: bytes, content_type: str | None) -> dict[str, Any] | None:
    """The decoded error object of an owner's answer, or None if it is not one of ours."""
    try:
        payload = codec.decode(content, codec.encoding_for(content_type))
    except CallError:
        return None
    if isinstance(payload, dict) and isinstance(payload.get("error"), str):
        return payload
    return None


def refusal(owner: errors.RemoteOwner, status: int, payload: Any) -> CallError | None:
    """The error to answer when the owner refused the forward's signature (None when it did
    not): a stale target (the owner restarted since the route was cached) is a stale route,
    any other refusal ``peer_refused``. Neither ran the call."""
    if status != errors.Unauthorized.status or not isinstance(payload, dict):
        return None
    if payload.get("error") == errors.StaleTarget.code:
        return StaleRoute(f"owner {owner.node} restarted since this node looked it up")
    return PeerRefused(f"owner {owner.node} refused this node's signed forward")
