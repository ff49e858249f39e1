"""Typed client usage, sync and async, that mypy must accept (checked by
tests/test_client_typing.py and by the project's mypy run): a handle from
``client.cell(Counter, name)`` has Counter's methods with their argument and result types
(async: through ``run``); a handle from a class name stays untyped."""

from __future__ import annotations

from cellactors.async_client import AsyncClient
from cellactors.client import Client
from tests.helpers.cells import Counter


def typed_calls(client: Client) -> int:
    """Calls through typed handles: arguments and results are checked against Counter."""
    counter = client.cell(Counter, "a")
    total: int = counter.increment(name="x", by=2)
    keyed = client.cell(Counter, "a", key="order-17")
    return total + keyed.get(name="x")


def untyped_calls(client: Client) -> object:
    """A handle named by its class's name takes any method and any arguments."""
    return client.cell("Counter", "a").anything(whatever=[1, 2])


async def async_typed_calls(client: AsyncClient) -> int:
    """The async handle's ``run`` checks the arguments and result against the method."""
    handle = client.cell(Counter, "a")
    total: int = await handle.run(Counter.increment, name="x", by=2)
    return total + await handle.with_key("order-18").run(Counter.get, name="x")
