"""Calls to a cell active on the serving node go straight into its mailbox from the event
loop (``Node.submit_here``, ``LoopReply``): no worker thread, the same answers, errors,
idempotency and metrics as the blocking path, and a fall back to that path whenever the
call needs it (an activation, a stop that raced the send)."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pykka
import pytest

from cellactors import Node
from cellactors.actors.messages import Invoke
from cellactors.actors.node import Submitted
from cellactors.core.idempotency import MAX_KEY_LENGTH
from cellactors.errors import NotDurable
from cellactors.persistence.store.s3 import S3Bucket
from cellactors.server.app import ServerSettings
from tests.helpers.cells import Counter, Slow
from tests.helpers.runtime import active_of, eventually, make_node
from tests.helpers.served import ServedNode, served_node


class _Spy:
    """Counts what ``submit_here`` sent and what took the blocking ``Node.call``."""

    def __init__(self, node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
        self.submitted = 0
        self.blocking = 0
        submit, call = node.submit_here, node.call

        def counting_submit(*args: Any, **kwargs: Any) -> Submitted | None:
            sub = submit(*args, **kwargs)
            self.submitted += sub is not None
            return sub

        def counting_call(*args: Any, **kwargs: Any) -> Any:
            self.blocking += 1
            return call(*args, **kwargs)

        monkeypatch.setattr(node, "submit_here", counting_submit)
        monkeypatch.setattr(node, "call", counting_call)


@pytest.fixture
def served(sw_bucket: S3Bucket) -> Iterator[ServedNode]:
    with served_node(sw_bucket, "n1") as s:
        yield s


def _post(s: ServedNode, method: str, body: dict[str, Any], **headers: str) -> httpx.Response:
    return httpx.post(f"{s.public}/cells/Counter/a/{method}", json=body, headers=headers)


def _result(s: ServedNode, method: str, body: dict[str, Any], **headers: str) -> Any:
    answer = _post(s, method, body, **headers)
    assert answer.status_code == 200, answer.text
    return answer.json()["result"]


def _calls(node: Node, method: str, outcome: str) -> float:
    return float(node.metrics.calls.labels("Counter", method, outcome)._value.get())


def test_warm_calls_skip_the_worker_thread_and_answer_the_same(
    served: ServedNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = served.node
    assert _result(served, "increment", {"name": "x"}) == 1  # activates: blocking path
    spy = _Spy(node, monkeypatch)
    for n in range(2, 6):
        assert _result(served, "increment", {"name": "x"}) == n
    assert _result(served, "get", {"name": "x"}) == 5
    assert (spy.submitted, spy.blocking) == (5, 0)
    assert _calls(node, "increment", "ok") == 5 and _calls(node, "get", "ok") == 1

    # A keyed call is recorded, and answered from its record when sent again.
    first = _result(served, "increment", {"name": "x"}, **{"Idempotency-Key": "k1"})
    again = _result(served, "increment", {"name": "x"}, **{"Idempotency-Key": "k1"})
    assert first == again == 6
    # A method that raises is rolled back and reported as failed, like on the blocking path.
    failed = _post(served, "fail_after_write", {"name": "x"})
    assert failed.status_code == 422 and failed.json()["outcome"] == "failed"
    assert _result(served, "get", {"name": "x"}) == 6
    assert _calls(node, "fail_after_write", "failed") == 1
    assert (spy.submitted, spy.blocking) == (9, 0)


def test_a_cold_cell_takes_the_blocking_path(
    served: ServedNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = _Spy(served.node, monkeypatch)
    assert _result(served, "increment", {"name": "x"}) == 1
    assert (spy.submitted, spy.blocking) == (0, 1)
    bad = httpx.post(f"{served.public}/cells/Counter/a/nope", json={})
    assert bad.status_code == 404 and (spy.submitted, spy.blocking) == (0, 2)


def test_a_forwarded_call_to_an_active_cell_skips_the_worker_thread_too(
    sw_bucket: S3Bucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    with served_node(sw_bucket, "n1") as owner, served_node(sw_bucket, "n2") as other:
        assert _result(owner, "increment", {"name": "x"}) == 1  # active on n1
        spy = _Spy(owner.node, monkeypatch)
        through = httpx.post(f"{other.public}/cells/Counter/a/increment", json={"name": "x"})
        assert through.status_code == 200 and through.json()["result"] == 2
        assert through.headers["x-cellactors-node"] == "n1"
        assert (spy.submitted, spy.blocking) == (1, 0)


def test_calls_to_active_cells_stay_within_max_concurrent_calls(sw_bucket: S3Bucket) -> None:
    """The direct path takes a slot of the call limiter like the blocking path does: with 2
    slots, a third call to a third active cell waits until one of the first two is done."""
    Slow.gate, Slow.entered = threading.Event(), 0
    with served_node(sw_bucket, "n1", ServerSettings(max_concurrent_calls=2)) as s:
        s.node.register(Slow)
        for name in "abc":  # activate all three (the blocking path)
            assert httpx.post(f"{s.public}/cells/Slow/{name}/get", json={}).status_code == 200
        answers: dict[str, int] = {}

        def hold(name: str) -> None:
            r = httpx.post(f"{s.public}/cells/Slow/{name}/hold", json={}, timeout=20)
            answers[name] = r.status_code

        threads = [threading.Thread(target=hold, args=(n,), daemon=True) for n in "abc"]
        try:
            for t in threads:
                t.start()
            eventually(lambda: Slow.entered == 2)
            threads[0].join(0.3)  # give a third call every chance to start
            assert Slow.entered == 2
        finally:
            Slow.gate.set()
        for t in threads:
            t.join(20)
        assert answers == {"a": 200, "b": 200, "c": 200} and Slow.entered == 3


@pytest.fixture
def node(sw_bucket: S3Bucket) -> Iterator[Node]:
    node = make_node(sw_bucket, "n1")
    node.cell(Counter, "a").increment("x")  # active from here on
    try:
        yield node
    finally:
        node.stop()


def _submitted(node: Node, **changes: Any) -> Submitted:
    """A submitted call that was never sent (the tests set its state by hand)."""
    active = active_of(node, "Counter:a")
    assert active is not None
    invoke = Invoke("get", (), {"name": "x"}, pykka.ThreadingFuture())
    sub = Submitted("Counter", "get", invoke, active, 0.0, float("inf"))
    return dataclasses.replace(sub, **changes)


def test_submit_here_only_for_an_active_cell_of_a_serving_node(node: Node) -> None:
    def submit(name: str, method: str = "get", key: str | None = None) -> Submitted | None:
        reply: pykka.ThreadingFuture[Any] = pykka.ThreadingFuture()
        return node.submit_here("Counter", name, method, {"name": "x"}, reply=reply, key=key)

    assert submit("b") is None  # not active here: the blocking path activates it
    assert submit("a", method="nope") is None  # refused there, and counted
    assert submit("a", key="k" * (MAX_KEY_LENGTH + 1)) is None
    sub = submit("a")
    assert sub is not None and sub.invoke.reply.get(timeout=5) == 1
    assert node.answer(sub) == 1
    node.drain()
    assert submit("a") is None


def test_a_call_the_stopped_cell_never_took_goes_the_blocking_path(node: Node) -> None:
    class Stopped(pykka.ThreadingActor):
        pass

    dead = Stopped.start()
    dead.stop()
    sub = _submitted(node)
    assert (
        node.still_pending(
            dataclasses.replace(sub, active=dataclasses.replace(sub.active, cell=dead))
        )
        is False
    )
    assert node.still_pending(sub) is True  # the live cell has it queued


def test_no_answer_by_the_deadline_is_not_durable_and_counted(node: Node) -> None:
    sub = _submitted(node, deadline=0.0)
    sub.invoke.started = True
    before = _calls(node, "get", "unknown")
    with pytest.raises(NotDurable, match="within the call timeout"):
        node.still_pending(sub)
    assert _calls(node, "get", "unknown") == before + 1


def test_an_answer_held_while_the_node_fenced_is_not_sent(node: Node) -> None:
    sub = _submitted(node)
    sub.invoke.reply.set(1)
    assert node.answer(sub) == 1
    node.fence("test: lease lost")
    with pytest.raises(NotDurable, match="fenced itself"):
        node.answer(sub)
