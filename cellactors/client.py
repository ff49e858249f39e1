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

import time
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, cast, overload

import httpx

from cellactors.attempts import (
    ClientBase,
    FeedRetry,
    HandleBase,
    check_key,
    new_key,
    post_error,
    records,
)
from cellactors.core.changes import Change
from cellactors.errors import CallError, error_from_answer
from cellactors.socket_client import CellSocket
from cellactors.wire.unsent import WriteWatch

if TYPE_CHECKING:
    from cellactors.actors.cell import CellActor

__all__ = ["CellHandle", "Client", "error_from_answer", "new_key"]

#: A cell class: ``client.cell(Counter, "a")`` is typed as a ``Counter``.
C = TypeVar("C", bound="CellActor")


class CellHandle(HandleBase["Client"]):
    """One cell; attribute access gives its methods: ``handle.increment(by=1)``.

    A handle from :meth:`with_key` sends that idempotency key with every call made through
    it: use it for one logical call (a second, different call with the same key is refused
    with :class:`~cellactors.errors.KeyConflict`). Cell methods named ``with_key`` or
    starting with ``_`` are reachable through :meth:`Client.invoke`.
    """

    def with_key(self, key: str) -> CellHandle:
        """A handle on the same cell whose calls carry the idempotency key ``key``."""
        return CellHandle(self._client, self._cls_name, self._name, check_key(key), self._cls)

    def __getattr__(self, method: str) -> Callable[..., Any]:
        if method.startswith("_"):
            raise AttributeError(method)

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._client.invoke(*self._call_args(method, args, kwargs), key=self._key)

        call.__name__ = method
        return call


class Client(ClientBase[httpx.Client]):
    """Calls cells on any node of a fleet, failing over between ``urls``.

    ``idempotency_keys=False`` sends no key unless one is given explicitly; calls without a
    key are never retried after an ``unknown`` outcome. A failed call is retried (see the
    module's docstring) until ``retry_for`` seconds have passed since its first attempt,
    and at most ``max_attempts`` times in all when given; ``backoff`` is the first back-off
    delay in seconds (doubling, with jitter, up to 2 s).
    """

    def _new_http(self, timeout: httpx.Timeout) -> httpx.Client:
        return httpx.Client(timeout=timeout)

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
            check_key(key)
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
        call = self._call(cls_name, name, method, kwargs, key)
        while True:
            answer = self._post(call.url(), call.body, call.headers)
            if isinstance(answer, httpx.Response) and answer.is_success:
                return self._result(answer)
            time.sleep(call.failed(answer))

    def _post(self, url: str, body: bytes, headers: dict[str, str]) -> httpx.Response | CallError:
        """One attempt: the answer, or the error of a request that got none (``not_run``
        when the request never left whole, else ``unknown``)."""
        watch = WriteWatch()
        try:
            return self._http.post(url, content=body, headers=headers, extensions={"trace": watch})
        except httpx.HTTPError as e:
            return post_error(url, e, watch)

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
        feed = self._feed(cls_name, name, after, follow, wait)
        while True:
            err: CallError | None = None
            try:
                with self._http.stream(
                    "GET", feed.url(), params=feed.params(), headers=feed.headers
                ) as resp:
                    if not resp.is_success:
                        resp.read()
                        raise feed.answer_error(resp)
                    for record in records(resp, self.encoding):
                        change = feed.change(record)
                        if change is not None:
                            yield change
            except FeedRetry as retry:
                err = retry.error
            except httpx.HTTPError as e:
                err = feed.cut_off(e)
            if err is None:
                if feed.ended():
                    return
                continue
            time.sleep(feed.failed(err))

    def connect(
        self, cls: type[CellActor] | str, name: str, *, tags: Sequence[str] = (), **options: Any
    ) -> CellSocket:
        """A WebSocket to the cell (its ``on_connect`` runs), through the first of the
        client's nodes that takes it, resumed on another if that node goes away
        (:class:`~cellactors.socket_client.CellSocket`)."""
        cls_name = cls if isinstance(cls, str) else cls.__name__
        return CellSocket(self.urls, cls_name, name, tags=tags, token=self.token, **options)

    def close(self) -> None:
        """Close the underlying connection pool (if this client created it)."""
        if self._own_http:
            self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
