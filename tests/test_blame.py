"""Answers that blame the right party: arguments that do not fit a method never ran (400
``bad_request``, ``not_run``, nothing in the bucket), and an ``on_activate`` that raises is
the cell's own bug (``activation_raised``, ``not_run``, not retryable, naming the class and
message), unlike a fault of the node or the store (``activation_failed``, retryable)."""

from __future__ import annotations

import httpx
import pytest

from cellactors import CellActor, Client, Node
from cellactors.core import keys
from cellactors.errors import (
    ActivationFailed,
    ActivationRaised,
    BadRequest,
    MethodFailed,
    NodeUnavailable,
)
from cellactors.persistence.store.s3 import S3Bucket
from tests.helpers.cells import Counter
from tests.helpers.runtime import make_node
from tests.helpers.served import served_node


class Broken(CellActor):
    """An ``on_activate`` with a bug in it."""

    def on_activate(self) -> None:
        self.db.execute("CREATE TABLE IF NOT EXISTS t (n INTEGER)")
        raise KeyError("missing-config")

    def ping(self) -> int:
        return 1


class Caller(CellActor):
    """An ``on_activate`` that calls another cell, whose node is unavailable."""

    def on_activate(self) -> None:
        self.cell("Nowhere", "x").ping()

    def ping(self) -> int:
        return 1


def calls_metric(node: Node, outcome: str) -> float:
    total = 0.0
    for line in node.metrics_text().splitlines():
        if line.startswith("cellactors_calls_total{") and f'outcome="{outcome}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({}, "missing a required argument: 'name'"),
        ({"name": "x", "bye": 2}, "unexpected keyword argument 'bye'"),
    ],
)
def test_arguments_that_do_not_fit_never_run_and_leave_nothing(
    sw_bucket: S3Bucket, kwargs: dict[str, object], words: str
) -> None:
    with served_node(sw_bucket, "n1") as served:
        resp = httpx.post(f"{served.public}/cells/Counter/a/increment", json=kwargs, timeout=10)
        assert resp.status_code == 400, resp.text
        body = resp.json()
        assert (body["error"], body["outcome"], body["retryable"]) == (
            "bad_request",
            "not_run",
            False,
        )
        assert words in body["message"] and "Counter.increment(name" in body["message"]
        assert calls_metric(served.node, "failed") == 0
        assert calls_metric(served.node, "not_run") == 1
    assert list(sw_bucket.list(keys.cell_root("Counter:a"))) == []  # no own.json, no batch


def test_a_call_between_cells_with_bad_arguments_is_refused_before_it_runs(
    sw_bucket: S3Bucket,
) -> None:
    node = make_node(sw_bucket, "n1")
    try:
        with pytest.raises(BadRequest, match="missing a required argument"):
            node.call("Counter", "b", "increment", {"by": 2})
        assert node.cell(Counter, "b").increment("x", by=2) == 2
    finally:
        node.stop()


def test_an_on_activate_that_raises_is_the_cells_bug_and_not_retryable(
    sw_bucket: S3Bucket,
) -> None:
    with served_node(sw_bucket, "n1", classes=(Broken, Counter)) as served:
        resp = httpx.post(f"{served.public}/cells/Broken/x/ping", json={}, timeout=10)
        assert resp.status_code == 500, resp.text
        body = resp.json()
        assert (body["error"], body["outcome"], body["retryable"]) == (
            "activation_raised",
            "not_run",
            False,
        )
        assert (body["type"], body["detail"]) == ("KeyError", "'missing-config'")
        assert "on_activate of Broken:x raised KeyError" in body["message"]
        with (
            Client(served.public, retry_for=30) as client,
            pytest.raises(ActivationRaised) as caught,
        ):
            client.call("Broken", "x", "ping")
        assert caught.value.exc_type == "KeyError"
        assert caught.value.outcome == "not_run" and not caught.value.retryable


def test_in_process_the_on_activate_error_carries_the_users_exception(
    sw_bucket: S3Bucket,
) -> None:
    node = make_node(sw_bucket, "n1")
    node.register(Broken)
    try:
        with pytest.raises(ActivationRaised) as caught:
            node.call("Broken", "y", "ping")
        failed = caught.value.__cause__
        assert isinstance(failed, MethodFailed) and isinstance(failed.__cause__, KeyError)
        assert failed.__cause__.__traceback__ is not None  # the user's frames
    finally:
        node.stop()


def test_an_on_activate_that_meets_a_transient_refusal_stays_retryable(
    sw_bucket: S3Bucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its call to another cell was refused as not run and retryable (that cell's node
    is unavailable): a fault of the fleet, not of this cell's code."""
    node = make_node(sw_bucket, "n1")
    node.register(Caller)

    def unavailable(*_args: object, **_kwargs: object) -> object:
        raise NodeUnavailable("the owner of Nowhere:x is unavailable (test)")

    monkeypatch.setattr(node, "call_cell", unavailable)
    try:
        with pytest.raises(ActivationFailed) as caught:
            node.call("Caller", "z", "ping")
        assert caught.value.retryable and caught.value.outcome == "not_run"
    finally:
        node.stop()
