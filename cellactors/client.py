"""A small synchronous client for a cellactors fleet.

``Client(["http://a:8080", "http://b:8080"]).cell("Counter", "a").increment(by=2)`` posts
the keyword arguments to ``/cells/Counter/a/increment`` and returns the result; error
answers are raised as the matching :mod:`cellactors.errors` class.

Retries go to the next node, and only when they cannot run a call twice: a connection that
failed before the request was sent, a 503 ``node_unavailable`` or ``activation_failed``
(nothing ran), and a 409 ``stale_route`` (refused before running). A ``not_durable`` answer or
a failure after the request may have been sent (read timeout, reset) is retried only with
``retry_unsafe=True``: the call may already have executed.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal
from urllib.parse import quote

import httpx

from cellactors.errors import (
    NOT_RUN,
    OUTCOMES,
    UNKNOWN,
    ActivationFailed,
    BadRequest,
    CallError,
    MethodFailed,
    NodeUnavailable,
    NotDurable,
    StaleRoute,
    UnknownCell,
)
from cellactors.server import codec

__all__ = ["CellHandle", "Client"]

_BY_CODE: dict[str, type[CallError]] = {
    cls.code: cls
    for cls in (
        UnknownCell,
        BadRequest,
        codec.PayloadTooLarge,
        NotDurable,
        NodeUnavailable,
        StaleRoute,
        ActivationFailed,
    )
}
SAFE_RETRY_CODES = frozenset({NodeUnavailable.code, ActivationFailed.code, StaleRoute.code})
UNSAFE_RETRY_CODES = frozenset({NotDurable.code})
# Failures after which the request certainly was not sent.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
_MAX_BACKOFF = 2.0


def error_from_answer(status: int, payload: Any) -> CallError:
    """Rebuild the error a server answered with (its JSON/msgpack error object)."""
    if not isinstance(payload, dict) or not isinstance(payload.get("error"), str):
        err = CallError(f"HTTP {status}: unexpected answer {str(payload)[:200]!r}")
        err.status = status
        return err
    code = payload["error"]
    message = str(payload.get("message", ""))
    if code == MethodFailed.code:
        return MethodFailed(str(payload.get("type", "Exception")), str(payload.get("detail", "")))
    cls = _BY_CODE.get(code)
    if cls is not None:
        return cls(message)
    err = CallError(message)
    err.status = status
    err.code = code
    outcome = payload.get("outcome")
    err.outcome = outcome if outcome in OUTCOMES else UNKNOWN
    err.retryable = err.outcome == NOT_RUN and bool(payload.get("retryable", False))
    return err


class CellHandle:
    """One cell; attribute access gives its methods: ``handle.increment(by=1)``."""

    def __init__(self, client: Client, cls_name: str, name: str) -> None:
        self._client = client
        self._cls_name = cls_name
        self._name = name

    def __getattr__(self, method: str) -> Callable[..., Any]:
        if method.startswith("_"):
            raise AttributeError(method)

        def call(**kwargs: Any) -> Any:
            return self._client.call(self._cls_name, self._name, method, **kwargs)

        call.__name__ = method
        return call

    def __repr__(self) -> str:
        return f"<CellHandle {self._cls_name}:{self._name}>"


class Client:
    """Calls cells on any node of a fleet, failing over between ``urls``."""

    def __init__(
        self,
        urls: Sequence[str] | str,
        *,
        timeout: float = 40.0,
        connect_timeout: float = 3.0,
        retry_unsafe: bool = False,
        encoding: Literal["json", "msgpack"] = "json",
        max_attempts: int | None = None,
        http: httpx.Client | None = None,
    ) -> None:
        self.urls = [urls] if isinstance(urls, str) else list(urls)
        if not self.urls:
            raise ValueError("Client needs at least one node URL")
        self.urls = [u.rstrip("/") for u in self.urls]
        self.retry_unsafe = retry_unsafe
        self.encoding: codec.Encoding = encoding
        self.max_attempts = max_attempts or max(2, len(self.urls))
        self._own_http = http is None
        self._http = http or httpx.Client(timeout=httpx.Timeout(timeout, connect=connect_timeout))
        self._start = itertools.count()
        self._start_lock = threading.Lock()

    def cell(self, cls_name: str, name: str) -> CellHandle:
        """A handle on the cell ``<cls_name>:<name>``."""
        return CellHandle(self, cls_name, name)

    def call(self, cls_name: str, name: str, method: str, /, **kwargs: Any) -> Any:
        """Call ``method`` on the cell with keyword arguments; return its result."""
        body = codec.encode(kwargs, self.encoding)
        path = "/cells/{}/{}/{}".format(*(_quote(p) for p in (cls_name, name, method)))
        headers = {"Content-Type": codec.CONTENT_TYPES[self.encoding]}
        with self._start_lock:
            start = next(self._start) % len(self.urls)
        last: Exception | None = None
        for attempt in range(self.max_attempts):
            index = (start + attempt) % len(self.urls)
            if attempt >= len(self.urls):
                time.sleep(min(_MAX_BACKOFF, 0.1 * 2 ** (attempt - len(self.urls))))
            url = self.urls[index] + path
            try:
                resp = self._http.post(url, content=body, headers=headers)
            except _NOT_SENT as e:
                last = NodeUnavailable(f"{self.urls[index]} unreachable: {e!r}")
                last.__cause__ = e
                continue
            except httpx.HTTPError as e:
                unknown = NotDurable(f"{self.urls[index]}: outcome unknown, may have run: {e!r}")
                unknown.__cause__ = e
                if self.retry_unsafe:
                    last = unknown
                    continue
                raise unknown from e
            if resp.is_success:
                return self._decode(resp)["result"]
            err = error_from_answer(resp.status_code, self._decode_error(resp))
            if err.code in SAFE_RETRY_CODES and err.retryable:
                last = err
                continue
            if err.code in UNSAFE_RETRY_CODES and self.retry_unsafe:
                last = err
                continue
            raise err
        assert last is not None
        raise last

    def _decode(self, resp: httpx.Response) -> Any:
        payload = codec.decode(resp.content, codec.encoding_for(resp.headers.get("content-type")))
        if not isinstance(payload, dict) or "result" not in payload:
            raise CallError(f"unexpected success answer {resp.content[:200]!r}")
        return payload

    def _decode_error(self, resp: httpx.Response) -> Any:
        try:
            return codec.decode(resp.content, codec.encoding_for(resp.headers.get("content-type")))
        except CallError:
            return resp.text

    def close(self) -> None:
        """Close the underlying connection pool (if this client created it)."""
        if self._own_http:
            self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _quote(part: str) -> str:
    return quote(part, safe="")
