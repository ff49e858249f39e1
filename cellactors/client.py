"""A small synchronous client for a cellactors fleet.

``Client(["http://a:8080", "http://b:8080"]).cell("Counter", "a").increment(by=2)`` posts
the keyword arguments to ``/cells/Counter/a/increment`` and returns the result; error
answers are raised as the matching :mod:`cellactors.errors` class, whose ``outcome`` says
whether the call ran: ``not_run`` (never started), ``unknown`` (may have been applied) or
``failed`` (ran, rolled back).

Exactly-once calls: every logical call gets a fresh idempotency key (``uuid4().hex``), sent
as the ``Idempotency-Key`` header and reused on every retry of that call, so the owning cell
runs it at most once and a retry returns the first result. Pick the key yourself with
``client.cell("Counter", "a").with_key("order-17").increment(by=1)`` or
``client.invoke("Counter", "a", "increment", {"by": 1}, key="order-17")`` to retry a call
safely later (e.g. after a crash of the caller); reusing a key for another method or other
arguments is refused with :class:`~cellactors.errors.KeyConflict`. Keys expire on the cell
after a retention window (default 24 h) and a per-cell cap: a retry after that runs again.

Retries (bounded by ``max_attempts``, with exponential back-off; each moves to the next URL):

- ``not_run`` errors that are transient (``node_unavailable``, ``activation_failed``,
  ``stale_route``, ``storage_unavailable``) and connections that failed before the request
  was sent;
- ``unknown`` outcomes (``not_durable``, ``internal``, unreadable answers, a connection lost
  after the request was sent, a read timeout) only when the call has a key: always, unless
  the client was made with ``idempotency_keys=False`` and no explicit key was given; then
  they raise at once;
- ``failed`` outcomes (``method_failed``, ``bad_result``) never, nor other ``not_run`` errors
  (``bad_request``, ``unknown_cell``, ``key_conflict``, ...).

If every attempt fails and an earlier one had an unknown outcome, the error raised is
:class:`~cellactors.errors.NotDurable` (the call may have run), never a ``not_run`` error.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
import uuid
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from typing import Any, Literal
from urllib.parse import quote

import httpx
import msgpack

from cellactors.core.changes import Change, HistoryCollected
from cellactors.errors import (
    NOT_RUN,
    OUTCOMES,
    UNKNOWN,
    ActivationFailed,
    BadRequest,
    BadResult,
    CallCycle,
    CallError,
    KeyConflict,
    MethodFailed,
    NodeStorageFault,
    NodeUnavailable,
    NotDurable,
    StaleRoute,
    UnknownCell,
    UnknownMethod,
)
from cellactors.server import codec

__all__ = ["CellHandle", "Client", "error_from_answer", "new_key"]

_BY_CODE: dict[str, type[CallError]] = {
    cls.code: cls
    for cls in (
        UnknownCell,
        UnknownMethod,
        BadRequest,
        codec.PayloadTooLarge,
        NotDurable,
        NodeUnavailable,
        NodeStorageFault,
        StaleRoute,
        ActivationFailed,
        BadResult,
        KeyConflict,
        CallCycle,
    )
}
# Failures after which the request certainly was not sent.
_NOT_SENT = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.PoolTimeout,
    httpx.UnsupportedProtocol,
)
_MAX_BACKOFF = 2.0


def new_key() -> str:
    """A fresh idempotency key (32 hex characters)."""
    return uuid.uuid4().hex


def error_from_answer(status: int, payload: Any) -> CallError:
    """Rebuild the error a server answered with (its JSON/msgpack error object). An answer
    that is not one of ours (e.g. a proxy's HTML page) has an ``unknown`` outcome."""
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


def _check_key(key: str) -> str:
    if not codec.is_valid_key(key):
        raise ValueError(f"invalid idempotency key {key!r}: use 1-128 of [A-Za-z0-9._:-]")
    return key


class CellHandle:
    """One cell; attribute access gives its methods: ``handle.increment(by=1)``.

    A handle from :meth:`with_key` sends that idempotency key with every call made through
    it: use it for one logical call (a second, different call with the same key is refused
    with :class:`~cellactors.errors.KeyConflict`). Cell methods named ``with_key`` or
    starting with ``_`` are reachable through :meth:`Client.invoke`.
    """

    def __init__(self, client: Client, cls_name: str, name: str, key: str | None = None) -> None:
        self._client = client
        self._cls_name = cls_name
        self._name = name
        self._key = key

    def with_key(self, key: str) -> CellHandle:
        """A handle on the same cell whose calls carry the idempotency key ``key``."""
        return CellHandle(self._client, self._cls_name, self._name, _check_key(key))

    def __getattr__(self, method: str) -> Callable[..., Any]:
        if method.startswith("_"):
            raise AttributeError(method)

        def call(**kwargs: Any) -> Any:
            return self._client.invoke(self._cls_name, self._name, method, kwargs, key=self._key)

        call.__name__ = method
        return call

    def __repr__(self) -> str:
        key = f" key={self._key}" if self._key is not None else ""
        return f"<CellHandle {self._cls_name}:{self._name}{key}>"


class Client:
    """Calls cells on any node of a fleet, failing over between ``urls``.

    ``idempotency_keys=False`` sends no key unless one is given explicitly; calls without a
    key are never retried after an ``unknown`` outcome. ``max_attempts`` defaults to
    ``max(3, len(urls))``; ``backoff`` is the first back-off delay in seconds (doubling, with
    jitter, up to 2 s).
    """

    def __init__(
        self,
        urls: Sequence[str] | str,
        *,
        timeout: float = 40.0,
        connect_timeout: float = 3.0,
        encoding: Literal["json", "msgpack"] = "json",
        max_attempts: int | None = None,
        idempotency_keys: bool = True,
        backoff: float = 0.1,
        http: httpx.Client | None = None,
    ) -> None:
        self.urls = [urls] if isinstance(urls, str) else list(urls)
        if not self.urls:
            raise ValueError("Client needs at least one node URL")
        self.urls = [u.rstrip("/") for u in self.urls]
        self.encoding: codec.Encoding = encoding
        self.max_attempts = max_attempts or max(3, len(self.urls))
        self.idempotency_keys = idempotency_keys
        self.backoff = backoff
        self._own_http = http is None
        self._http = http or httpx.Client(timeout=httpx.Timeout(timeout, connect=connect_timeout))
        self._start = itertools.count()
        self._start_lock = threading.Lock()

    def cell(self, cls_name: str, name: str) -> CellHandle:
        """A handle on the cell ``<cls_name>:<name>``."""
        return CellHandle(self, cls_name, name)

    def call(self, cls_name: str, name: str, method: str, /, **kwargs: Any) -> Any:
        """Call ``method`` on the cell with keyword arguments (a fresh idempotency key);
        return its result."""
        return self.invoke(cls_name, name, method, kwargs)

    def invoke(
        self,
        cls_name: str,
        name: str,
        method: str,
        kwargs: Mapping[str, Any] | None = None,
        *,
        key: str | None = None,
    ) -> Any:
        """Call ``method`` on the cell with the arguments ``kwargs``, under the idempotency
        key ``key`` (default: a fresh one, unless ``idempotency_keys=False``)."""
        if key is not None:
            _check_key(key)
        elif self.idempotency_keys:
            key = new_key()
        return self._send(cls_name, name, method, dict(kwargs or {}), key)

    def _send(
        self, cls_name: str, name: str, method: str, kwargs: dict[str, Any], key: str | None
    ) -> Any:
        try:
            body = codec.encode(kwargs, self.encoding)
        except codec.ENCODE_ERRORS as e:
            raise BadRequest(f"the arguments cannot be encoded as {self.encoding}: {e}") from e
        path = "/cells/{}/{}/{}".format(*(_quote(p) for p in (cls_name, name, method)))
        headers = {"Content-Type": codec.CONTENT_TYPES[self.encoding]}
        if key is not None:
            headers[codec.IDEMPOTENCY_HEADER] = key
        with self._start_lock:
            start = next(self._start) % len(self.urls)
        last: CallError | None = None
        maybe_ran = False
        for attempt in range(self.max_attempts):
            if last is not None:
                time.sleep(self._delay(attempt, last))
            base = self.urls[(start + attempt) % len(self.urls)]
            err: CallError
            try:
                resp = self._http.post(base + path, content=body, headers=headers)
            except _NOT_SENT as e:
                err = NodeUnavailable(f"{base} unreachable: {e!r}")
                err.__cause__ = e
            except httpx.HTTPError as e:
                err = NotDurable(f"{base}: outcome unknown, the call may have run: {e!r}")
                err.__cause__ = e
            else:
                if resp.is_success:
                    return self._result(resp)
                err = error_from_answer(resp.status_code, self._decode_error(resp))
            maybe_ran = maybe_ran or err.outcome == UNKNOWN
            last = err
            if not _may_retry(err, key):
                break
        assert last is not None
        if maybe_ran and last.outcome == NOT_RUN:
            hint = f" (idempotency key {key!r})" if key is not None else ""
            raise NotDurable(
                f"an earlier attempt may have run the call{hint}; the last one: {last}"
            ) from last
        raise last

    def _delay(self, attempt: int, last: CallError) -> float:
        """No wait while trying each URL once after a node was unavailable (the next one
        may well answer); otherwise exponential back-off with jitter."""
        if attempt < len(self.urls) and isinstance(last, NodeUnavailable):
            return 0.0
        delay = min(_MAX_BACKOFF, self.backoff * 2.0 ** max(0, attempt - 1))
        return delay * random.uniform(0.5, 1.0)

    def _result(self, resp: httpx.Response) -> Any:
        try:
            payload = codec.decode(
                resp.content, codec.encoding_for(resp.headers.get("content-type"))
            )
        except CallError:
            payload = None
        if not isinstance(payload, dict) or "result" not in payload:
            err = CallError(f"unreadable success answer {resp.content[:200]!r}")
            err.status = resp.status_code
            err.code = "bad_answer"
            raise err
        return payload["result"]

    def _decode_error(self, resp: httpx.Response) -> Any:
        try:
            return codec.decode(resp.content, codec.encoding_for(resp.headers.get("content-type")))
        except CallError:
            return resp.text

    def changes(
        self,
        cls_name: str,
        name: str,
        after: int = 0,
        *,
        follow: bool = False,
        wait: float = 25.0,
    ) -> Generator[Change, None, None]:
        """The cell's acknowledged transactions after txid ``after``, in txid order, from
        ``GET /cells/{cls}/{name}/changes`` (any node serves it from the bucket).

        Without ``follow`` the iterator ends once it has what the bucket holds now. With
        ``follow`` it never ends: each request stays open ``wait`` seconds (below the
        client's read timeout) and is renewed after the last txid seen, on the next URL when
        a node fails; ``close()`` it to end the open request. History that was collected raises
        :class:`~cellactors.core.changes.HistoryCollected` (its ``oldest_txid`` and
        ``snapshot_txid`` say where to start)."""
        pos = after
        failures = 0
        start = next(self._start) % len(self.urls)
        path = f"/cells/{_quote(cls_name)}/{_quote(name)}/changes"
        accept = codec.CONTENT_TYPES[self.encoding]
        while True:
            base = self.urls[(start + failures) % len(self.urls)]
            params = {"after": str(pos), "wait": str(wait if follow else 0)}
            err: CallError | None = None
            try:
                with self._http.stream(
                    "GET", base + path, params=params, headers={"Accept": accept}
                ) as resp:
                    if not resp.is_success:
                        resp.read()
                        raise _feed_error(resp.status_code, self._decode_error(resp))
                    for record in _records(resp, self.encoding):
                        if "error" in record:
                            raise _feed_error(503, record)
                        change = Change.from_wire(record)
                        if change.txid <= pos:
                            continue
                        pos = change.txid
                        start, failures = (start + failures) % len(self.urls), 0  # stay here
                        yield change
            except _FeedRetry as retry:
                err = retry.error
            except httpx.HTTPError as e:
                err = NodeUnavailable(f"{base}: the feed was cut off: {e!r}")
            if err is None:
                if not follow:
                    return
                # A round that ended well: stay on this node, and earlier failures do not add
                # up (a quiet feed would otherwise give up after max_attempts blips).
                start, failures = (start + failures) % len(self.urls), 0
                continue
            failures += 1
            if failures >= self.max_attempts:
                raise err
            time.sleep(self._delay(failures, err))

    def close(self) -> None:
        """Close the underlying connection pool (if this client created it)."""
        if self._own_http:
            self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _FeedRetry(Exception):
    """A feed request failed in a way another try may not (``error`` says why)."""

    def __init__(self, error: CallError) -> None:
        super().__init__(str(error))
        self.error = error


def _feed_error(status: int, payload: Any) -> BaseException:
    """The error a feed answer carries: transient ones are retried (on the next URL),
    others raised as they are; ``history_collected`` keeps where to start from."""
    if isinstance(payload, dict) and payload.get("error") == HistoryCollected.code:
        collected = HistoryCollected(str(payload.get("message", "")))
        for field in ("requested", "oldest_txid", "snapshot_txid", "snapshot_epoch"):
            if field in payload:
                setattr(collected, field, payload[field])
        return collected
    err = error_from_answer(status, payload)
    if err.outcome == NOT_RUN and err.retryable:
        return _FeedRetry(err)
    return err


def _records(resp: httpx.Response, encoding: codec.Encoding) -> Iterator[dict[str, Any]]:
    """The records of a streamed feed answer as they arrive."""
    if encoding == "msgpack":
        unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
        for chunk in resp.iter_bytes():
            unpacker.feed(chunk)
            yield from unpacker
        return
    for line in resp.iter_lines():
        if line.strip():
            yield codec.decode(line.encode("utf-8"), "json")


def _may_retry(err: CallError, key: str | None) -> bool:
    """Transient ``not_run`` errors always; ``unknown`` outcomes only under a key."""
    if err.outcome == NOT_RUN:
        return err.retryable
    return err.outcome == UNKNOWN and key is not None


def _quote(part: str) -> str:
    # "." and ".." would be removed from the URL as dot segments: send them encoded, so the
    # server sees (and refuses) them instead of another route.
    if part in (".", ".."):
        return part.replace(".", "%2E")
    return quote(part, safe="")
