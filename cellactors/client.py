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

Retries ride out a node's crash: a failed attempt is sent again, each time to the next
URL, with capped exponential back-off and jitter, until ``retry_for`` seconds (default 30:
a lease TTL of 10 s plus the takeover, with room to spare) have passed since the first
attempt, or ``max_attempts`` attempts were made when that optional cap is given:

- ``not_run`` errors that are transient (``node_unavailable``, ``activation_failed``,
  ``stale_route``, ``storage_unavailable``) and requests that never left: a connection
  refused or not made in time,
  no pooled connection free in time, or a connection (a fresh one, or one from the
  keep-alive pool) that failed while the request was being written, so the node never had
  it whole;
- ``unknown`` outcomes (``not_durable``, ``internal``, unreadable answers, a connection lost
  after the whole request was written, a read timeout) only when the call has a key: always,
  unless the client was made with ``idempotency_keys=False`` and no explicit key was given;
  then they raise at once;
- ``failed`` outcomes (``method_failed``, ``bad_result``) never, nor other ``not_run`` errors
  (``bad_request``, ``unknown_cell``, ``key_conflict``, ...).

A call whose every attempt was ``not_run`` raises a ``not_run`` error (the last one). If an
earlier attempt had an unknown outcome, the error raised is
:class:`~cellactors.errors.NotDurable` (the call may have run), never a ``not_run`` error.
"""

from __future__ import annotations

import inspect
import itertools
import random
import threading
import time
import uuid
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast, overload
from urllib.parse import quote

import httpx
import msgpack

from cellactors.core import retries
from cellactors.core.changes import Change
from cellactors.core.idempotency import KEY_RULE, valid_key
from cellactors.errors import (
    NOT_RUN,
    UNKNOWN,
    BadRequest,
    CallError,
    NodeUnavailable,
    NotDurable,
    error_from_answer,
)
from cellactors.wire import codec
from cellactors.wire.unsent import NOT_CONNECTED, WriteWatch

if TYPE_CHECKING:
    from cellactors.actors.cell import CellActor

__all__ = ["CellHandle", "Client", "error_from_answer", "new_key"]

#: A cell class: ``client.cell(Counter, "a")`` is typed as a ``Counter``.
C = TypeVar("C", bound="CellActor")

_MAX_BACKOFF = 2.0


def new_key() -> str:
    """A fresh idempotency key (32 hex characters)."""
    return uuid.uuid4().hex


def _check_key(key: str) -> str:
    if not valid_key(key):
        raise ValueError(f"invalid idempotency key {key!r}: use {KEY_RULE}")
    return key


class CellHandle:
    """One cell; attribute access gives its methods: ``handle.increment(by=1)``.

    A handle from :meth:`with_key` sends that idempotency key with every call made through
    it: use it for one logical call (a second, different call with the same key is refused
    with :class:`~cellactors.errors.KeyConflict`). Cell methods named ``with_key`` or
    starting with ``_`` are reachable through :meth:`Client.invoke`.
    """

    def __init__(
        self,
        client: Client,
        cls_name: str,
        name: str,
        key: str | None = None,
        cls: type[Any] | None = None,
    ) -> None:
        self._client = client
        self._cls_name = cls_name
        self._name = name
        self._key = key
        self._cls = cls

    def with_key(self, key: str) -> CellHandle:
        """A handle on the same cell whose calls carry the idempotency key ``key``."""
        return CellHandle(self._client, self._cls_name, self._name, _check_key(key), self._cls)

    def __getattr__(self, method: str) -> Callable[..., Any]:
        if method.startswith("_"):
            raise AttributeError(method)

        def call(*args: Any, **kwargs: Any) -> Any:
            kwargs = keyword_arguments(self._cls, method, args, kwargs)
            return self._client.invoke(self._cls_name, self._name, method, kwargs, key=self._key)

        call.__name__ = method
        return call

    def __repr__(self) -> str:
        key = f" key={self._key}" if self._key is not None else ""
        return f"<CellHandle {self._cls_name}:{self._name}{key}>"


class Client:
    """Calls cells on any node of a fleet, failing over between ``urls``.

    ``idempotency_keys=False`` sends no key unless one is given explicitly; calls without a
    key are never retried after an ``unknown`` outcome. A failed call is retried (see the
    module's docstring) until ``retry_for`` seconds have passed since its first attempt,
    and at most ``max_attempts`` times in all when given; ``backoff`` is the first back-off
    delay in seconds (doubling, with jitter, up to 2 s).
    """

    def __init__(
        self,
        urls: Sequence[str] | str,
        *,
        timeout: float = 40.0,
        connect_timeout: float = 3.0,
        encoding: Literal["json", "msgpack"] = "json",
        retry_for: float = 30.0,
        max_attempts: int | None = None,
        idempotency_keys: bool = True,
        backoff: float = 0.1,
        http: httpx.Client | None = None,
        token: str | None = None,
    ) -> None:
        #: Sent as ``Authorization: Bearer <token>`` (an API key or a JWT) when given.
        self.token = token
        self.urls = [urls] if isinstance(urls, str) else list(urls)
        if not self.urls:
            raise ValueError("Client needs at least one node URL")
        self.urls = [u.rstrip("/") for u in self.urls]
        self.encoding: codec.Encoding = encoding
        self.retry = retries.RetryPolicy(
            retry_for, max_attempts, backoff, max(backoff, _MAX_BACKOFF)
        )
        self.idempotency_keys = idempotency_keys
        self._own_http = http is None
        self._http = http or httpx.Client(timeout=httpx.Timeout(timeout, connect=connect_timeout))
        self._start = itertools.count()
        self._start_lock = threading.Lock()

    @overload
    def cell(self, cls: str, name: str, *, key: str | None = None) -> CellHandle: ...

    @overload
    def cell(self, cls: type[C], name: str, *, key: str | None = None) -> C: ...

    def cell(self, cls: type[C] | str, name: str, *, key: str | None = None) -> C | CellHandle:
        """A handle on the cell ``<cls>:<name>`` whose calls carry ``key`` when given.

        Given the class (``client.cell(Counter, "a")``) the handle is typed as that class,
        so mypy checks each call's arguments and result against the method's signature
        (only its public methods are reachable; they run remotely). Given its name, the
        handle is untyped."""
        if key is not None:
            _check_key(key)
        if isinstance(cls, str):
            return CellHandle(self, cls, name, key)
        return cast(C, CellHandle(self, cls.__name__, name, key, cls))

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
        headers = {"Content-Type": codec.CONTENT_TYPES[self.encoding], **self._auth()}
        if key is not None:
            headers[codec.IDEMPOTENCY_HEADER] = key
        start = self._next_start()
        began = time.monotonic()
        maybe_ran = False
        attempts = 0
        while True:
            base = self.urls[(start + attempts) % len(self.urls)]
            attempts += 1
            answer = self._post(base + path, body, headers)
            if isinstance(answer, httpx.Response):
                if answer.is_success:
                    return self._result(answer)
                err = error_from_answer(answer.status_code, self._decode_error(answer))
            else:
                err = answer
            maybe_ran = maybe_ran or err.outcome == UNKNOWN
            if not retries.may_retry(err.outcome, err.retryable, key is not None):
                break
            wait = self._wait(attempts, began, err)
            if wait is None:
                break
            time.sleep(wait)
        if maybe_ran and err.outcome == NOT_RUN:
            hint = f" (idempotency key {key!r})" if key is not None else ""
            raise NotDurable(
                f"an earlier attempt may have run the call{hint}; the last one: {err}"
            ) from err
        raise err

    def _next_start(self) -> int:
        """The URL a new call (or feed) tries first: round robin over ``urls``."""
        with self._start_lock:
            return next(self._start) % len(self.urls)

    def _auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def _post(self, url: str, body: bytes, headers: dict[str, str]) -> httpx.Response | CallError:
        """One attempt: the answer, or the error of a request that got none (``not_run``
        when the request never left whole, else ``unknown``)."""
        watch = WriteWatch()
        try:
            return self._http.post(url, content=body, headers=headers, extensions={"trace": watch})
        except httpx.HTTPError as e:
            return _transport_error(url, e, watch)

    def _wait(self, attempts: int, began: float, last: CallError) -> float | None:
        """Seconds to wait before the next attempt, or None when the retries are over: no
        wait while trying each URL once after a node was unavailable (the next one may well
        answer); otherwise exponential back-off with jitter, until the deadline."""
        first_pass = attempts < len(self.urls) and isinstance(last, NodeUnavailable)
        elapsed = time.monotonic() - began
        return retries.next_wait(self.retry, attempts, elapsed, first_pass, random.random())

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
        client's read timeout) and is renewed after the last txid seen; ``close()`` it to end
        the open request. A failed request (a node down, a cut-off stream, a transient
        ``not_run`` answer) is tried again on the next URL, with back-off, until
        ``retry_for`` seconds have passed since the first failure in a row (and at most
        ``max_attempts`` times in a row, when given). History that was collected raises
        :class:`~cellactors.errors.HistoryCollected` (its ``oldest_txid`` and
        ``snapshot_txid`` say where to start)."""
        pos = after
        failures = 0
        failing_since = 0.0  # monotonic start of the current run of failures
        start = self._next_start()
        path = f"/cells/{_quote(cls_name)}/{_quote(name)}/changes"
        accept = codec.CONTENT_TYPES[self.encoding]
        while True:
            base = self.urls[(start + failures) % len(self.urls)]
            params = {"after": str(pos), "wait": str(wait if follow else 0)}
            err: CallError | None = None
            try:
                with self._http.stream(
                    "GET", base + path, params=params, headers={"Accept": accept, **self._auth()}
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
                # up (a quiet feed would otherwise give up after a few blips a day apart).
                start, failures = (start + failures) % len(self.urls), 0
                continue
            if failures == 0:
                failing_since = time.monotonic()
            failures += 1
            # A feed is a read: every transient failure may be tried again, on the next URL,
            # under the same deadline as a call, counted from the first failure in a row.
            delay = self._wait(failures, failing_since, err)
            if delay is None:
                raise err
            time.sleep(delay)

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


def _transport_error(url: str, exc: httpx.HTTPError, watch: WriteWatch) -> CallError:
    """The error of an attempt that got no answer. ``not_run`` (``NodeUnavailable``, tried
    again) when the request never reached the node whole: no connection, or the write of
    the request failed (:mod:`cellactors.wire.unsent`). Otherwise the whole request was
    written and the connection failed after it (lost, reset, closed, timed out): the node
    may have run the call, so the outcome is unknown (``NotDurable``)."""
    base = url.split("/cells/", 1)[0]
    err: CallError
    if isinstance(exc, httpx.LocalProtocolError):
        err = BadRequest(f"the request to {base} could not be formed: {exc!r}")
    elif isinstance(exc, NOT_CONNECTED):
        err = NodeUnavailable(f"{base} unreachable: {exc!r}")
    elif watch.never_sent(exc):
        err = NodeUnavailable(f"{base}: the connection failed before the request was sent: {exc!r}")
    else:
        err = NotDurable(f"{base}: outcome unknown, the call may have run: {exc!r}")
    err.__cause__ = exc
    return err


def keyword_arguments(
    cls: type[Any] | None, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> dict[str, Any]:
    """The call's arguments by name, as the wire carries them: positional ones are named
    by the method's signature when the handle knows the class, refused otherwise."""
    if not args:
        return kwargs
    func = getattr(cls, method, None) if cls is not None else None
    if func is None:
        raise TypeError(f"{method}() takes keyword arguments only on an untyped handle")
    bound = inspect.signature(func).bind(None, *args, **kwargs)
    named = dict(bound.arguments)
    named.pop(next(iter(named)))  # self
    for pname, param in inspect.signature(func).parameters.items():
        if param.kind is inspect.Parameter.VAR_KEYWORD and pname in named:
            named.update(named.pop(pname))
    return named


def _quote(part: str) -> str:
    # "." and ".." would be removed from the URL as dot segments: send them encoded, so the
    # server sees (and refuses) them instead of another route.
    if part in (".", ".."):
        return part.replace(".", "%2E")
    return quote(part, safe="")
