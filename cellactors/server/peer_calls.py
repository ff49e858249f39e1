"""Calls between cells across nodes: the node's forwarder in ``cellactors serve``.

When a cell (or the outbox) calls a cell owned by another live node, the node hands the call
to :class:`PeerCaller`, which sends it signed to the owner's internal listener like a
forwarded client call, with the call chain in ``X-Cellactors-Chain`` (so the owner refuses a
cycle) and the idempotency key if any. The owner's answer comes back as the result or as the
matching :mod:`cellactors.errors` class; a request that was never sent is
``node_unavailable`` and a stale target ``stale_route`` (both ``not_run``: the node looks the
owner up again), a request sent without an answer ``not_durable`` (``unknown``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import httpx

import cellactors.errors as errors
from cellactors.core.idempotency import check_key
from cellactors.errors import (
    CallError,
    NodeUnavailable,
    NotDurable,
    RemoteOwner,
    StaleRoute,
    error_from_answer,
)
from cellactors.server import codec, signing
from cellactors.server.unsent import WriteWatch

CHAIN_HEADER = "X-Cellactors-Chain"
INTERNAL_PREFIX = "/internal/cells/"


def encode_chain(chain: tuple[str, ...]) -> str:
    """The header value: cell ids joined by commas (a cell id never holds a comma)."""
    return ",".join(chain)


def decode_chain(value: str | None) -> tuple[str, ...]:
    """The call chain a header carries (empty without one)."""
    if not value:
        return ()
    return tuple(part for part in value.split(",") if part)


class PeerCaller:
    """A :data:`~cellactors.actors.node.Forwarder` over signed HTTP (thread-safe)."""

    def __init__(
        self,
        node_id: str,
        fleet_key: bytes,
        timeout: float = 40.0,
        connect_timeout: float = 3.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.node_id = node_id
        self.key = fleet_key
        self.clock = clock  # epoch seconds the signatures are stamped with (the store's)
        self._timeout = httpx.Timeout(timeout, connect=connect_timeout)
        self._local = threading.local()

    def _client(self) -> httpx.Client:
        client: httpx.Client | None = getattr(self._local, "client", None)
        if client is None:
            client = self._local.client = httpx.Client(timeout=self._timeout)
        return client

    def __call__(
        self,
        owner: RemoteOwner,
        cls_name: str,
        name: str,
        method: str,
        kwargs: dict[str, Any],
        key: str | None,
        chain: tuple[str, ...],
    ) -> Any:
        if key is not None:
            check_key(key)
        body = codec.encode(kwargs, "msgpack")
        parts = "/".join(quote(p, safe="") for p in (cls_name, name, method))
        path = INTERNAL_PREFIX + f"{cls_name}/{name}/{method}"
        headers = signing.sign_request(
            self.key,
            "POST",
            path,
            body,
            source=self.node_id,
            target=owner.node,
            target_generation=owner.generation,
            idempotency_key=key,
            now=self.clock(),
        )
        headers["Content-Type"] = codec.CONTENT_TYPES["msgpack"]
        if chain:
            headers[CHAIN_HEADER] = encode_chain(chain)
        addr = owner.addr.rstrip("/")
        base = addr if "://" in addr else f"http://{addr}"
        watch = WriteWatch()
        try:
            resp = self._client().post(
                base + INTERNAL_PREFIX + parts,
                content=body,
                headers=headers,
                extensions={"trace": watch},
            )
        except httpx.HTTPError as err:
            if watch.never_sent(err):  # no connection, or the write failed: not run
                raise NodeUnavailable(f"owner {owner.node} is unreachable: {err!r}") from err
            raise NotDurable(f"call to {owner.node} has an unknown outcome: {err!r}") from err
        try:
            payload = codec.decode(
                resp.content, codec.encoding_for(resp.headers.get("content-type"))
            )
        except CallError:
            payload = None
        if resp.is_success and isinstance(payload, dict) and "result" in payload:
            return payload["result"]
        if isinstance(payload, dict) and payload.get("error") == errors.StaleTarget.code:
            raise StaleRoute(f"owner {owner.node} restarted since this node looked it up")
        raise error_from_answer(resp.status_code, payload)  # 401 ``unauthorized``: not run


__all__ = ["CHAIN_HEADER", "PeerCaller", "decode_chain", "encode_chain"]
