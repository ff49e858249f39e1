"""Calls between cells across nodes: the node's forwarder in ``cellactors serve``.

When a cell (or the outbox) calls a cell owned by another live node, the node hands the call
to :class:`PeerCaller`, which sends it signed to the owner's internal listener like a
forwarded client call, with the call chain in ``X-Cellactors-Chain`` (so the owner refuses a
cycle), the originating caller and the trace context (both signed) and the idempotency key
if any. The owner's answer
comes back as the result or as the matching :mod:`cellactors.errors` class; a request
that was never sent is ``node_unavailable`` and a stale target ``stale_route`` (both
``not_run``: the node looks the owner up again), a request sent without an answer
``not_durable`` (``unknown``).
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx

from cellactors.core.idempotency import check_key
from cellactors.core.principal import Principal
from cellactors.errors import (
    CallError,
    RemoteOwner,
    error_from_answer,
)
from cellactors.server import forward
from cellactors.server.peer_keys import KeySource, PeerKeys, key_source
from cellactors.tracing import spans
from cellactors.wire import codec
from cellactors.wire.unsent import WriteWatch

#: A shorter wait for the forwards made in this context (seconds; None: the caller's
#: own timeout). A socket event waits no longer than a lease TTL and a second: past it, a
#: paused owner can answer nothing valid, and the retry (under the same key) reaches the
#: next owner.
_patience: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "cellactors_forward_patience", default=None
)


@contextlib.contextmanager
def patience(seconds: float) -> Iterator[None]:
    """Forwards made inside wait at most ``seconds`` for their answer."""
    token = _patience.set(seconds)
    try:
        yield
    finally:
        _patience.reset(token)


class PeerCaller:
    """A :data:`~cellactors.actors.node.Forwarder` over signed HTTP (thread-safe)."""

    def __init__(
        self,
        node_id: str,
        fleet_key: bytes | PeerKeys | KeySource,
        timeout: float = 40.0,
        connect_timeout: float = 3.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.node_id = node_id
        self.keys = key_source(fleet_key)
        self.clock = clock  # epoch seconds the signatures are stamped with (the store's)
        self._timeout = httpx.Timeout(timeout, connect=connect_timeout)
        self._local = threading.local()

    def client(self) -> httpx.Client:
        """This thread's keep-alive client to peers (one per thread: httpx's is not
        shared across threads)."""
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
        caller: Principal | None = None,
    ) -> Any:
        if key is not None:
            check_key(key)
        call = forward.signed(
            self.keys().signing,
            self.node_id,
            owner,
            cls_name,
            name,
            method,
            codec.encode(kwargs, "msgpack"),
            "msgpack",
            idempotency_key=key,
            now=self.clock(),
            chain=chain,
            caller=caller,
            trace=spans.traceparent(),  # the calling cell's span: the owner's is its child
        )
        watch = WriteWatch()
        try:
            wait = _patience.get()
            resp = self.client().post(
                call.url,
                content=call.body,
                headers=call.headers,
                extensions={"trace": watch},
                timeout=httpx.Timeout(wait, connect=min(wait, 3.0)) if wait else self._timeout,
            )
        except (httpx.HTTPError, httpx.InvalidURL) as err:
            if watch.never_sent(err):  # no connection, or the write failed: not run
                raise forward.unreachable(owner, err) from err
            raise forward.lost(owner, err) from err
        try:
            payload = codec.decode(
                resp.content, codec.encoding_for(resp.headers.get("content-type"))
            )
        except CallError:
            payload = None
        if resp.is_success and isinstance(payload, dict) and "result" in payload:
            return payload["result"]
        refused = forward.refusal(owner, resp.status_code, payload)
        if refused is not None:
            raise refused
        raise error_from_answer(resp.status_code, payload)


__all__ = ["PeerCaller"]
