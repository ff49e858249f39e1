"""Typed client usage that mypy must accept (checked by tests/test_client_typing.py and by
the project's mypy run): a handle from ``client.cell(Counter, name)`` has Counter's methods,
with their argument and result types; a handle from a class name stays untyped."""

from __future__ import annotations

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
