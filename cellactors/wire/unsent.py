"""Whether an HTTP request that got no answer ever reached its server whole, for the
senders of calls over a synchronous httpx client (:class:`cellactors.Client`, a node calling
a peer's cell).

A request that never left whole cannot have run (``not_run``); one written whole and then
cut off may have (``unknown``). With httpx over httpcore (HTTP/1.1), the request never left
whole when:

- no connection was made: ``ConnectError`` (refused, unknown host), ``ConnectTimeout``,
  ``PoolTimeout`` (no pooled connection free in time), ``UnsupportedProtocol``. A pooled
  keep-alive connection the server closed while it sat idle is found readable (closed) by
  httpcore before it is used, dropped and replaced by a new connection, so a dead node
  shows as a refused connection;
- writing the request failed: ``WriteTimeout``, or a ``WriteError`` (reset, broken pipe).
  httpcore hides a ``WriteError`` of HTTP/1.1 and reads on (a server may answer early, e.g.
  413), so what surfaces is the read's ``ReadError`` or ``RemoteProtocolError``; only its
  trace (``http11.send_request_headers.failed`` / ``...send_request_body.failed``) tells
  the two apart. :class:`WriteWatch` listens to that trace.

Anything else (``ReadError``, ``RemoteProtocolError``, ``ReadTimeout`` after the request was
written) may come after the server read the request: the outcome is unknown. (An async
client on asyncio sees less: its transport buffers writes, so a write traced as complete
may still be cut off unsent; the answer is then unknown, never wrongly ``not_run``.) A request
written whole to a connection the server closed a moment earlier is, from here,
indistinguishable from one the server read before it died, so it stays unknown too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx

#: No connection was made: nothing was sent.
NOT_CONNECTED: tuple[type[httpx.HTTPError], ...] = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.PoolTimeout,
    httpx.UnsupportedProtocol,
)
#: A request known never to have left: no connection, or an address that is no URL.
NOT_SENT: tuple[type[Exception], ...] = (*NOT_CONNECTED, httpx.InvalidURL)
#: Writing the request failed (when httpcore lets it surface).
WRITE_FAILED: tuple[type[httpx.HTTPError], ...] = (httpx.WriteError, httpx.WriteTimeout)
_FAILED_WRITES = (".send_request_headers.failed", ".send_request_body.failed")


class WriteWatch:
    """httpcore's trace of one request (``extensions={"trace": watch}`` for a sync client,
    ``watch.atrace`` for an async one): ``write_failed`` once writing its head or body
    failed."""

    def __init__(self) -> None:
        self.write_failed = False

    def __call__(self, event: str, info: Mapping[str, Any]) -> None:
        if event.endswith(_FAILED_WRITES):
            self.write_failed = True

    async def atrace(self, event: str, info: Mapping[str, Any]) -> None:
        self(event, info)

    def never_sent(self, exc: Exception) -> bool:
        """Whether the request that failed with ``exc`` never reached the server whole."""
        return isinstance(exc, NOT_SENT + WRITE_FAILED) or self.write_failed


__all__ = ["NOT_CONNECTED", "NOT_SENT", "WRITE_FAILED", "WriteWatch"]
