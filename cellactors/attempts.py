"""What the sync and async clients share: the settings of a client, and the attempts of
one call or feed as pure state (which URL next, whether a failure is tried again and after
how long, which error ends it), so :class:`~cellactors.client.Client` and
:class:`~cellactors.async_client.AsyncClient` differ only in how they wait and send.
The retry rules are those of :mod:`cellactors.client`'s docstring."""

from __future__ import annotations

import inspect
import itertools
import random
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any, Generic, Literal, TypeVar
from urllib.parse import quote

import httpx
import msgpack
from opentelemetry import propagate

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

_MAX_BACKOFF = 2.0


def new_key() -> str:
    """A fresh idempotency key (32 hex characters)."""
    return uuid.uuid4().hex


def check_key(key: str) -> str:
    """``key`` if it is a valid idempotency key; ``ValueError`` otherwise."""
    if not valid_key(key):
        raise ValueError(f"invalid idempotency key {key!r}: use {KEY_RULE}")
    return key


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
    signature = inspect.signature(func)
    named = dict(signature.bind(None, *args, **kwargs).arguments)
    named.pop(next(iter(named)))  # self
    for pname, param in signature.parameters.items():
        if param.kind is inspect.Parameter.VAR_KEYWORD and pname in named:
            named.update(named.pop(pname))
    return named


#: The HTTP client a client sends with: ``httpx.Client`` or ``httpx.AsyncClient``.
H = TypeVar("H", httpx.Client, httpx.AsyncClient)


K = TypeVar("K")


class HandleBase(Generic[K]):
    """What a sync and an async handle on one cell share: the cell, the key its calls
    carry, and the class (when given) that names positional arguments."""

    def __init__(
        self, client: K, cls_name: str, name: str, key: str | None = None, cls: Any = None
    ) -> None:
        self._client = client
        self._cls_name = cls_name
        self._name = name
        self._key = key
        self._cls = cls

    def _call_args(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """``invoke``'s arguments for a call of ``method`` through this handle."""
        named = keyword_arguments(self._cls, method, args, kwargs)
        return (self._cls_name, self._name, method, named)

    def __repr__(self) -> str:
        key = f" key={self._key}" if self._key is not None else ""
        return f"<{type(self).__name__} {self._cls_name}:{self._name}{key}>"


class ClientBase(Generic[H]):
    """The settings and pure helpers of a client (see :class:`cellactors.client.Client`);
    ``http`` is the sync or async httpx client to send with (made here when not given)."""

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
        http: H | None = None,
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
        self._start = itertools.count()
        self._start_lock = threading.Lock()
        self._own_http = http is None
        self._http: H = http or self._new_http(httpx.Timeout(timeout, connect=connect_timeout))

    def _new_http(self, timeout: httpx.Timeout) -> H:
        """The httpx client to send with when none was given."""
        raise NotImplementedError

    def _call(
        self,
        cls_name: str,
        name: str,
        method: str,
        kwargs: Mapping[str, Any] | None,
        key: str | None,
    ) -> Call:
        """The attempts of one logical call (a fresh key unless given or turned off)."""
        if key is not None:
            check_key(key)
        elif self.idempotency_keys:
            key = new_key()
        try:
            body = codec.encode(dict(kwargs or {}), self.encoding)
        except codec.ENCODE_ERRORS as e:
            raise BadRequest(f"the arguments cannot be encoded as {self.encoding}: {e}") from e
        path = "/cells/{}/{}/{}".format(*(quote_part(p) for p in (cls_name, name, method)))
        headers = {"Content-Type": codec.CONTENT_TYPES[self.encoding], **self._auth()}
        if key is not None:
            headers[codec.IDEMPOTENCY_HEADER] = key
        # The caller's trace context, when its program traces (OpenTelemetry's global
        # propagator: ``traceparent``), so the node's spans join its trace; nothing else.
        propagate.inject(headers)
        return Call(self, path, body, headers, key)

    def _feed(self, cls_name: str, name: str, after: int, follow: bool, wait: float) -> Feed:
        return Feed(self, cls_name, name, after, follow, wait)

    def _next_start(self) -> int:
        """The URL a new call (or feed) tries first: round robin over ``urls``."""
        with self._start_lock:
            return next(self._start) % len(self.urls)

    def _auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

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


class Call:
    """The attempts of one logical call: ``url()`` for the next one, ``failed(answer)``
    after one that did not succeed (the wait before the next, or the final error)."""

    def __init__(
        self,
        client: ClientBase[Any],
        path: str,
        body: bytes,
        headers: dict[str, str],
        key: str | None,
    ) -> None:
        self.client = client
        self.path = path
        self.body = body
        self.headers = headers
        self.key = key
        self.start = client._next_start()
        self.began = time.monotonic()
        self.maybe_ran = False
        self.attempts = 0

    def url(self) -> str:
        """The URL of the next attempt (each attempt goes to the next node)."""
        urls = self.client.urls
        self.attempts += 1
        return urls[(self.start + self.attempts - 1) % len(urls)] + self.path

    def failed(self, answer: httpx.Response | CallError) -> float:
        """Seconds to wait before trying again; raises the call's error when it is over."""
        if isinstance(answer, httpx.Response):
            err = error_from_answer(answer.status_code, self.client._decode_error(answer))
        else:
            err = answer
        self.maybe_ran = self.maybe_ran or err.outcome == UNKNOWN
        wait = None
        if retries.may_retry(err.outcome, err.retryable, self.key is not None):
            wait = self.client._wait(self.attempts, self.began, err)
        if wait is not None:
            return wait
        if self.maybe_ran and err.outcome == NOT_RUN:
            hint = f" (idempotency key {self.key!r})" if self.key is not None else ""
            raise NotDurable(
                f"an earlier attempt may have run the call{hint}; the last one: {err}"
            ) from err
        raise err


class Feed:
    """The requests of one change feed: where to ask next and from which txid, which
    changes are new, and what a failed request means (see ``Client.changes``)."""

    def __init__(
        self,
        client: ClientBase[Any],
        cls_name: str,
        name: str,
        after: int,
        follow: bool,
        wait: float,
    ) -> None:
        self.client = client
        self.pos = after
        self.follow = follow
        self.wait = wait
        self.failures = 0
        self.failing_since = 0.0  # monotonic start of the current run of failures
        self.start = client._next_start()
        self.path = f"/cells/{quote_part(cls_name)}/{quote_part(name)}/changes"
        self.headers = {"Accept": codec.CONTENT_TYPES[client.encoding], **client._auth()}

    def url(self) -> str:
        urls = self.client.urls
        return urls[(self.start + self.failures) % len(urls)] + self.path

    def params(self) -> dict[str, str]:
        return {"after": str(self.pos), "wait": str(self.wait if self.follow else 0)}

    def answer_error(self, resp: httpx.Response) -> BaseException:
        """The error of a feed answer that is no success (raise it)."""
        return feed_error(resp.status_code, self.client._decode_error(resp))

    def change(self, record: dict[str, Any]) -> Change | None:
        """The record's change when it is new (and this node is kept), else None; a record
        that is an error raises it."""
        if "error" in record:
            raise feed_error(503, record)
        change = Change.from_wire(record)
        if change.txid <= self.pos:
            return None
        self.pos = change.txid
        self._stay()
        return change

    def ended(self) -> bool:
        """After a round that ended well: True when the feed is over (no ``follow``).
        Otherwise stay on this node; earlier failures do not add up (a quiet feed would
        otherwise give up after a few blips a day apart)."""
        if not self.follow:
            return True
        self._stay()
        return False

    def failed(self, err: CallError) -> float:
        """A feed is a read: every transient failure may be tried again, on the next URL,
        under the same deadline as a call, counted from the first failure in a row. The
        wait before the next request; raises ``err`` when the retries are over."""
        if self.failures == 0:
            self.failing_since = time.monotonic()
        self.failures += 1
        delay = self.client._wait(self.failures, self.failing_since, err)
        if delay is None:
            raise err
        return delay

    def cut_off(self, exc: httpx.HTTPError) -> CallError:
        return NodeUnavailable(f"{self.url()}: the feed was cut off: {exc!r}")

    def _stay(self) -> None:
        self.start, self.failures = (self.start + self.failures) % len(self.client.urls), 0


class FeedRetry(Exception):
    """A feed request failed in a way another try may not (``error`` says why)."""

    def __init__(self, error: CallError) -> None:
        super().__init__(str(error))
        self.error = error


def feed_error(status: int, payload: Any) -> BaseException:
    """The error a feed answer carries: transient ones are retried (on the next URL),
    others raised as they are; ``history_collected`` keeps where to start from."""
    err = error_from_answer(status, payload)
    if err.outcome == NOT_RUN and err.retryable:
        return FeedRetry(err)
    return err


def records(resp: httpx.Response, encoding: codec.Encoding) -> Iterator[dict[str, Any]]:
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


async def arecords(resp: httpx.Response, encoding: codec.Encoding) -> AsyncIterator[dict[str, Any]]:
    """The records of a streamed feed answer as they arrive, from an async client."""
    if encoding == "msgpack":
        unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
        async for chunk in resp.aiter_bytes():
            unpacker.feed(chunk)
            for record in unpacker:
                yield record
        return
    async for line in resp.aiter_lines():
        if line.strip():
            yield codec.decode(line.encode("utf-8"), "json")


def post_error(url: str, exc: httpx.HTTPError, watch: WriteWatch) -> CallError:
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


def quote_part(part: str) -> str:
    # "." and ".." would be removed from the URL as dot segments: send them encoded, so the
    # server sees (and refuses) them instead of another route.
    if part in (".", ".."):
        return part.replace(".", "%2E")
    return quote(part, safe="")
