"""The asyncio client: :class:`AsyncClient` has the surface of
:class:`~cellactors.client.Client` (``cell``, ``call``, ``invoke``, ``changes``,
``with_key``, ``token``) on ``httpx.AsyncClient``, and the same retry, key and outcome
rules: both run the attempts of :mod:`cellactors.attempts` and differ only in how they
send and wait.

``await client.cell("Counter", "a").increment(name="x")`` is untyped; for a call mypy
checks, name the method on a handle typed by its class:
``await client.cell(Counter, "a").run(Counter.increment, name="x")`` (an ``int``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Concatenate, Generic, ParamSpec, TypeVar, overload

import httpx

from cellactors.attempts import (
    ClientBase,
    FeedRetry,
    HandleBase,
    arecords,
    check_key,
    post_error,
)
from cellactors.core.changes import Change
from cellactors.errors import CallError
from cellactors.wire.unsent import WriteWatch

if TYPE_CHECKING:
    from cellactors.actors.cell import CellActor

__all__ = ["AsyncCellHandle", "AsyncClient"]

C = TypeVar("C", bound="CellActor")
P = ParamSpec("P")
R = TypeVar("R")


class AsyncCellHandle(HandleBase["AsyncClient"], Generic[C]):
    """One cell: ``await handle.increment(by=1)`` (untyped), or the typed
    ``await handle.run(Counter.increment, by=1)``; :meth:`with_key` as on the sync handle."""

    def with_key(self, key: str) -> AsyncCellHandle[C]:
        """A handle on the same cell whose calls carry the idempotency key ``key``."""
        return AsyncCellHandle(self._client, self._cls_name, self._name, check_key(key), self._cls)

    async def run(
        self, method: Callable[Concatenate[C, P], R], *args: P.args, **kwargs: P.kwargs
    ) -> R:
        """Call ``method`` (a method of the handle's class) on the cell; mypy checks the
        arguments and the result against its signature."""
        call_args = self._call_args(method.__name__, args, dict(kwargs))
        result: R = await self._client.invoke(*call_args, key=self._key)
        return result

    def __getattr__(self, method: str) -> Callable[..., Awaitable[Any]]:
        if method.startswith("_"):
            raise AttributeError(method)

        async def call(*args: Any, **kwargs: Any) -> Any:
            return await self._client.invoke(*self._call_args(method, args, kwargs), key=self._key)

        call.__name__ = method
        return call


class AsyncClient(ClientBase[httpx.AsyncClient]):
    """Calls cells on any node of a fleet from asyncio, failing over between ``urls``;
    the arguments are those of :class:`~cellactors.client.Client` (``http`` an
    ``httpx.AsyncClient``). Use it as ``async with AsyncClient(urls) as client:``."""

    def _new_http(self, timeout: httpx.Timeout) -> httpx.AsyncClient:
        return httpx.AsyncClient(timeout=timeout)

    @overload
    def cell(self, cls: str, name: str, *, key: str | None = None) -> AsyncCellHandle[Any]: ...

    @overload
    def cell(self, cls: type[C], name: str, *, key: str | None = None) -> AsyncCellHandle[C]: ...

    def cell(
        self, cls: type[C] | str, name: str, *, key: str | None = None
    ) -> AsyncCellHandle[Any]:
        """A handle on the cell ``<cls>:<name>`` whose calls carry ``key`` when given;
        typed by the class when given one (see :meth:`AsyncCellHandle.run`)."""
        if key is not None:
            check_key(key)
        if isinstance(cls, str):
            return AsyncCellHandle(self, cls, name, key)
        return AsyncCellHandle(self, cls.__name__, name, key, cls)

    async def call(self, cls_name: str, name: str, method: str, /, **kwargs: Any) -> Any:
        """Call ``method`` on the cell with keyword arguments (a fresh idempotency key)."""
        return await self.invoke(cls_name, name, method, kwargs)

    async def invoke(
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
            answer = await self._post(call.url(), call.body, call.headers)
            if isinstance(answer, httpx.Response) and answer.is_success:
                return self._result(answer)
            await asyncio.sleep(call.failed(answer))

    async def _post(
        self, url: str, body: bytes, headers: dict[str, str]
    ) -> httpx.Response | CallError:
        """One attempt: the answer, or the error of a request that got none."""
        watch = WriteWatch()
        try:
            return await self._http.post(
                url, content=body, headers=headers, extensions={"trace": watch.atrace}
            )
        except httpx.HTTPError as e:
            return post_error(url, e, watch)

    async def changes(
        self,
        cls_name: str,
        name: str,
        after: int = 0,
        *,
        follow: bool = False,
        wait: float = 25.0,
    ) -> AsyncGenerator[Change, None]:
        """The cell's change feed as an async iterator (see ``Client.changes``):
        ``async for change in client.changes("Counter", "a"):``; ``aclose()`` it to end
        a followed feed."""
        feed = self._feed(cls_name, name, after, follow, wait)
        while True:
            err: CallError | None = None
            try:
                async with self._http.stream(
                    "GET", feed.url(), params=feed.params(), headers=feed.headers
                ) as resp:
                    if not resp.is_success:
                        await resp.aread()
                        raise feed.answer_error(resp)
                    async for record in arecords(resp, self.encoding):
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
            await asyncio.sleep(feed.failed(err))

    async def aclose(self) -> None:
        """Close the underlying connection pool (if this client created it)."""
        if self._own_http:
            await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
