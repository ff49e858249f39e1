"""The sync and async clients against a served fleet (two real nodes on one SeaweedFS
bucket): typed calls, the change feed, failover from a stopped node to the other with the
call run once, and an ``unknown`` outcome (a read timeout) not retried without a key."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator

import httpx
import pytest

from cellactors.async_client import AsyncClient
from cellactors.client import Client
from cellactors.errors import NodeUnavailable, NotDurable
from cellactors.persistence.store.s3 import S3Bucket
from tests.helpers.cells import Counter, Slow
from tests.helpers.served import ServedNode, served_node

CLASSES = (Counter, Slow)


@pytest.fixture
def fleet(sw_bucket: S3Bucket) -> Iterator[tuple[ServedNode, ServedNode, contextlib.ExitStack]]:
    """Two served nodes; the test may stop the first early with the returned stack."""
    with served_node(sw_bucket, "n2", classes=CLASSES) as b, contextlib.ExitStack() as first:
        a = first.enter_context(served_node(sw_bucket, "n1", classes=CLASSES))
        yield a, b, first


def test_typed_calls_and_the_feed_from_both_clients(
    fleet: tuple[ServedNode, ServedNode, contextlib.ExitStack],
) -> None:
    a, b, _ = fleet
    urls = [a.public, b.public]
    with Client(urls) as client:
        assert client.cell(Counter, "c").increment(name="x", by=2) == 2
        assert client.cell(Counter, "c", key="order-1").increment("x") == 3

    async def go() -> tuple[int, int, int, list[int]]:
        async with AsyncClient(urls) as aclient:
            handle = aclient.cell(Counter, "c")
            first = await handle.run(Counter.increment, name="x", by=4)
            again = await handle.with_key("order-2").increment(name="x")
            got = await aclient.call("Counter", "c", "get", name="x")
            txids = [change.txid async for change in aclient.changes("Counter", "c")]
            return first, again, got, txids

    first, again, got, txids = asyncio.run(go())
    assert (first, again, got) == (7, 8, 8)
    assert len(txids) >= 4 and txids == sorted(txids)


def test_both_clients_fail_over_from_a_stopped_node_and_run_once(
    fleet: tuple[ServedNode, ServedNode, contextlib.ExitStack],
) -> None:
    a, b, first = fleet
    urls = [a.public, b.public]
    with Client(urls) as client:
        client.cell(Counter, "f").increment(name="x")
    first.close()  # node n1 drains and stops: its URL refuses connections
    sent: list[str] = []

    async def record(request: httpx.Request) -> None:
        sent.append(str(request.url))

    async def go() -> int:
        http = httpx.AsyncClient(event_hooks={"request": [record]})
        async with AsyncClient([a.public], backoff=0.01, retry_for=0.2) as dead:
            with pytest.raises(NodeUnavailable):
                await dead.cell(Counter, "f").run(Counter.get, name="x")
        async with http, AsyncClient(urls, http=http, backoff=0.01) as aclient:
            calls = [aclient.cell(Counter, "f").run(Counter.increment, name="x") for _ in (1, 2)]
            results = await asyncio.gather(*calls)
            return max(results)

    assert asyncio.run(go()) == 3
    assert any(url.startswith(a.public) for url in sent), sent  # tried the stopped node
    with Client(urls, backoff=0.01) as client:
        assert client.cell(Counter, "f").increment(name="x") == 4
        assert client.cell(Counter, "f").get(name="x") == 4


def test_an_unknown_outcome_is_not_retried_without_a_key(
    fleet: tuple[ServedNode, ServedNode, contextlib.ExitStack],
) -> None:
    a, b, _ = fleet
    Slow.gate, Slow.entered = threading.Event(), 0
    with Client([a.public, b.public]) as warm:  # activated: a held call starts at once
        assert [warm.cell(Slow, s).get() for s in ("s1", "s2")] == [2, 2]
    try:
        with (
            Client([a.public, b.public], timeout=0.5, idempotency_keys=False) as client,
            pytest.raises(NotDurable, match="outcome unknown"),
        ):
            client.cell(Slow, "s1").hold()

        async def go() -> None:
            async with AsyncClient([b.public, a.public], timeout=0.5, idempotency_keys=False) as c:
                with pytest.raises(NotDurable, match="outcome unknown") as info:
                    await c.cell(Slow, "s2").run(Slow.hold)
                assert isinstance(info.value.__cause__, httpx.ReadTimeout)

        asyncio.run(go())
    finally:
        Slow.gate.set()
    with Client([a.public, b.public]) as after:  # queued behind any retry of the cell
        assert [after.cell(Slow, s).get() for s in ("s1", "s2")] == [2, 2]
    assert Slow.entered == 2  # one attempt of each call, none retried
