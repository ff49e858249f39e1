"""A fake node behind the real HTTP apps, served on loopback, and signed requests to it."""

from __future__ import annotations

import contextlib
import io
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx

from cellactors.core import keys
from cellactors.errors import (
    BadResult,
    KeyConflict,
    MethodFailed,
    NodeUnavailable,
    NotDurable,
    RemoteOwner,
    StaleRoute,
    UnknownCell,
    UnknownMethod,
)
from cellactors.server import signing
from cellactors.server.app import ServerSettings
from cellactors.server.runner import Runner

KEY = bytes(range(32))


WAIT = 10.0  # upper bound for every wait; tests never sleep to synchronize


def wait_until(predicate: Callable[[], bool], timeout: float = WAIT) -> None:
    """Poll ``predicate`` until true; fail at the deadline."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met before the deadline")
        time.sleep(0.005)


Handler = Callable[["FakeNode", str, dict[str, Any]], Any]


def _increment(node: FakeNode, name: str, kwargs: dict[str, Any]) -> int:
    with node.lock:
        node.counters[name] = node.counters.get(name, 0) + int(kwargs.get("by", 1))
        return node.counters[name]


def _fail(node: FakeNode, name: str, kwargs: dict[str, Any]) -> None:
    raise MethodFailed("ValueError", "bad input")


def _not_durable(node: FakeNode, name: str, kwargs: dict[str, Any]) -> None:
    raise NotDurable("upload could not be proven durable")


def _crash(node: FakeNode, name: str, kwargs: dict[str, Any]) -> None:
    raise RuntimeError("a bug in the runtime")


def _wait(node: FakeNode, name: str, kwargs: dict[str, Any]) -> str:
    if not node.gate.wait(WAIT):
        raise AssertionError("gate never opened")
    return "released"


def _flaky(node: FakeNode, name: str, kwargs: dict[str, Any]) -> str:
    with node.lock:
        node.flaky_failures -= 1
        if node.flaky_failures >= 0:
            raise NotDurable("first try not durable")
    return "ok"


class CommittedButUnanswered(NotDurable):
    """Raised by the fake after it recorded the call's key: applied, answer lost."""


def _applied_then_lost(node: FakeNode, name: str, kwargs: dict[str, Any]) -> int:
    """Increments, and the first ``lost_answers`` times loses the answer after commit."""
    result = _increment(node, name, kwargs)
    with node.lock:
        node.lost_answers -= 1
        if node.lost_answers >= 0:
            raise CommittedButUnanswered("committed, but the answer was lost")
    return result


DEFAULT_METHODS: dict[str, Handler] = {
    "increment": _increment,
    "echo": lambda node, name, kwargs: kwargs,
    "whoami": lambda node, name, kwargs: node.node_id,
    "fail": _fail,
    "not_durable": _not_durable,
    "crash": _crash,
    "wait": _wait,
    "flaky": _flaky,
    "unencodable": lambda node, name, kwargs: object(),
    "nan": lambda node, name, kwargs: float("nan"),
    "big": lambda node, name, kwargs: 2**70,
    "applied_then_lost": _applied_then_lost,
}


class FakeNode:
    """Keeps the ``Node`` contract the HTTP layer is written against, with scripted routing.

    Like the runtime, it records ``key -> (method, kwargs, result)`` for every call that
    returns (or that commits and then loses its answer) under an idempotency key, answers a
    recorded key without running, refuses a key reused with other arguments, and runs
    ``result_check`` on the result "before commit" (a refusal is :class:`BadResult` and
    records nothing).
    """

    node_id: str
    generation: str
    status: str

    def __init__(self, node_id: str = "node-a") -> None:
        self.node_id = node_id
        self.generation = f"gen-{node_id}"
        self.status = "serving"
        self.classes: dict[str, type] = {"Counter": object}
        self.methods = dict(DEFAULT_METHODS)
        self.lock = threading.Lock()
        self.calls: list[tuple[str, str, str, dict[str, Any], bool]] = []
        self.routes: list[RemoteOwner] = []  # raised, in order, by non-forwarded calls
        self.stale_routes = 0  # forwarded calls to refuse with StaleRoute
        self.forgotten: list[tuple[str, str]] = []
        self.counters: dict[str, int] = {}
        self.flaky_failures = 0
        self.lost_answers = 0
        self.keys: list[str | None] = []  # the key of every call, in order
        self.checks: list[tuple[Any, BaseException | None]] = []  # (result, check's error)
        self.recorded: dict[str, tuple[str, dict[str, Any], Any]] = {}
        self.answering = True  # False: as if fenced while the answer was held
        self.in_flight = 0
        self.gate = threading.Event()
        self.drain_started = threading.Event()
        self.drain_release = threading.Event()
        self.drain_release.set()
        self.drains = 0

    def store_time(self) -> float:
        return time.time()

    def call(
        self,
        cls_name: str,
        name: str,
        method: str,
        kwargs: dict[str, Any],
        *,
        forwarded: bool = False,
        timeout: float = 30.0,
        key: str | None = None,
        result_check: Callable[[Any], None] | None = None,
        chain: tuple[str, ...] = (),
        caller: Any = None,
    ) -> Any:
        keys.make_cell_id(cls_name, name)  # InvalidCellId, like the runtime
        if cls_name not in self.classes:
            raise UnknownCell(f"no class {cls_name}")
        with self.lock:
            self.calls.append((cls_name, name, method, kwargs, forwarded))
            self.keys.append(key)
            if self.status != "serving":
                raise NodeUnavailable(f"node {self.node_id} is {self.status}")
            if not forwarded and self.routes:
                raise self.routes.pop(0)
            if forwarded and self.stale_routes:
                self.stale_routes -= 1
                raise StaleRoute(f"{self.node_id} does not own {cls_name}:{name}")
            handler = self.methods.get(method)
            if handler is None:
                raise UnknownMethod(f"{cls_name} has no method {method}")
            if key is not None and key in self.recorded:
                first_method, first_kwargs, first_result = self.recorded[key]
                if (first_method, first_kwargs) != (method, kwargs):
                    raise KeyConflict(f"key {key} was used for another call")
                return first_result
            self.in_flight += 1
        try:
            result = handler(self, name, kwargs)
        except CommittedButUnanswered:
            with self.lock:
                if key is not None:
                    self.recorded[key] = (method, kwargs, self.counters.get(name))
            raise
        finally:
            with self.lock:
                self.in_flight -= 1
        if result_check is not None:
            try:
                result_check(result)
            except Exception as e:
                self.checks.append((result, e))
                raise BadResult(f"result refused: {e}") from e
            self.checks.append((result, None))
        if key is not None:
            with self.lock:
                self.recorded[key] = (method, kwargs, result)
        return result

    def submit_here(self, *args: Any, **kwargs: Any) -> None:
        return None  # every call takes the blocking path, where the script runs

    def still_pending(self, sub: Any) -> bool:
        raise AssertionError("nothing is ever submitted to a FakeNode")

    def answer(self, sub: Any) -> Any:
        raise AssertionError("nothing is ever submitted to a FakeNode")

    def may_answer(self) -> bool:
        return self.answering and self.status in ("serving", "draining", "stopped")

    def state(self) -> dict[str, Any]:
        return {
            "node": self.node_id,
            "generation": self.generation,
            "lease_expires_ms": 123,
            "cells": [{"cell": "Counter:a", "epoch": 4, "acked_txid": 17}],
        }

    def metrics_text(self) -> str:
        return "# TYPE cellactors_calls_total counter\ncellactors_calls_total 3\n"

    def drain(self) -> None:
        self.status = "draining"
        self.drains += 1
        self.drain_started.set()
        assert self.drain_release.wait(WAIT)
        wait_until(lambda: self.in_flight == 0)
        self.status = "stopped"

    def forget_route(self, cls_name: str, name: str) -> None:
        with self.lock:
            self.forgotten.append((cls_name, name))

    def fleet(self) -> dict[str, Any]:
        raise NotImplementedError("the fake node has no fleet (tests/test_fleet_endpoint.py)")

    def feed_reader(self, cell_id: str) -> Any:
        raise NotImplementedError("the fake node has no change feed (tests/test_feed.py)")

    def feed_stream_refused(self) -> None:
        raise NotImplementedError("the fake node has no change feed (tests/test_feed.py)")

    def dead_letters(self, cls: str, name: str) -> list[Any]:
        raise NotImplementedError("the fake node has no outbox (tests/test_dead_letters_http.py)")

    def retry_dead_letters(self, cls: str, name: str, ids: Any = None) -> list[str]:
        raise NotImplementedError("the fake node has no outbox (tests/test_dead_letters_http.py)")

    def purge_dead_letters(self, cls: str, name: str, ids: Any = None) -> list[str]:
        raise NotImplementedError("the fake node has no outbox (tests/test_dead_letters_http.py)")


class Served:
    """A runner serving one fake node in a background thread."""

    def __init__(self, runner: Runner, node: FakeNode, thread: threading.Thread) -> None:
        self.runner = runner
        self.node = node
        self.thread = thread
        self.exit_code: int | None = None

    @property
    def public(self) -> str:
        assert self.runner.public_address is not None
        return "http://{}:{}".format(*self.runner.public_address)

    @property
    def internal(self) -> str:
        assert self.runner.internal_address is not None
        return "http://{}:{}".format(*self.runner.internal_address)

    @property
    def internal_hostport(self) -> str:
        assert self.runner.internal_address is not None
        return "{}:{}".format(*self.runner.internal_address)


@contextlib.contextmanager
def serving(
    node: FakeNode, key: bytes = KEY, settings: ServerSettings | None = None
) -> Iterator[Served]:
    """Serve ``node`` on two loopback ports (chosen by the OS) until the block ends."""
    runner = Runner(
        node,
        key,
        public=("127.0.0.1", 0),
        internal=("127.0.0.1", 0),
        settings=settings,
        fence_stream=io.StringIO(),
    )
    served: Served

    def main() -> None:
        served.exit_code = runner.run(install_signals=False)

    thread = threading.Thread(target=main, name=f"runner-{node.node_id}", daemon=True)
    served = Served(runner, node, thread)
    thread.start()
    wait_until(lambda: runner.ready.is_set() or not thread.is_alive())
    assert runner.ready.is_set(), "runner did not start"
    try:
        yield served
    finally:
        node.gate.set()
        runner.request_stop()
        thread.join(WAIT)
        assert not thread.is_alive(), "runner did not stop"


def signed_post(
    http: httpx.Client,
    served: Served,
    method: str = "whoami",
    body: bytes = b"{}",
    *,
    key: bytes = KEY,
    target: str | None = None,
    generation: str | None = None,
    idempotency_key: str | None = None,
    now: float | None = None,
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    path = f"/internal/cells/Counter/a/{method}"
    if headers is None:
        headers = signing.sign_request(
            key,
            "POST",
            path,
            body,
            source="node-z",
            target=target or served.node.node_id,
            target_generation=generation or served.node.generation,
            idempotency_key=idempotency_key,
            now=now,
        )
    return http.post(served.internal + path, content=body, headers=headers)


def owner_route(served: Served) -> RemoteOwner:
    """What the runtime raises when ``served``'s node owns the cell (lease: addr, generation)."""
    return RemoteOwner(served.node.node_id, served.internal, served.node.generation)


def post(http: httpx.Client, base: str, path: str, body: Any = None, **kw: Any) -> httpx.Response:
    if body is None:  # no arguments: an empty JSON body
        kw.setdefault("headers", {"content-type": "application/json"})
        return http.post(base + path, **kw)
    return http.post(base + path, json=body, **kw)
