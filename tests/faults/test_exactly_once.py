"""Exactly-once effects with idempotency keys, on real processes behind fault proxies: a call
whose answer was lost (to a fence, a dropped connection, a re-route through a forwarding
peer, the SIGKILL of its owner) and retried with the same key, by ``cellactors.Client`` or
by raw HTTP, is applied once and the retry returns the first result; and a ledger of 1,000
keyed calls under repeated kills and pauses ends with exactly one effect per call.

The ``Tally`` cell has no uniqueness constraint, so a second application would show as a
second row."""

from __future__ import annotations

import functools
import itertools
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterable

import httpx
import pytest

from cellactors.client import Client
from cellactors.errors import CallError, NotDurable
from tests.faults.conftest import MakeFaultFleet
from tests.faults.harness import FaultFleet, FaultNode
from tests.helpers.fleet import wait_for

pytestmark = pytest.mark.faults

TTL = 2.0


def rows(urls: list[str], cell: str) -> list[str]:
    """The Tally's rows, read through the first node that answers."""

    def read() -> list[str] | None:
        for url in urls:
            try:
                resp = httpx.post(f"{url}/cells/Tally/{cell}/rows", json={}, timeout=10)
            except httpx.HTTPError:
                continue
            if resp.status_code == 200:
                return list(resp.json()["result"])
        return None

    return wait_for(f"the rows of Tally:{cell}", read, 40)


def patient(urls: list[str]) -> Client:
    """A client that keeps retrying (with its key) through a takeover."""
    return Client(urls, retry_for=120.0, max_attempts=30, backoff=0.2, timeout=20)


def add_on(node: FaultNode, cell: str, entry: str) -> int:
    resp = httpx.post(
        f"{node.public_url}/cells/Tally/{cell}/add", json={"entry": entry}, timeout=20
    )
    assert resp.status_code == 200, resp.text
    return int(resp.json()["result"])


def hold_then_fence(fleet: FaultFleet, owner: FaultNode) -> None:
    """The owner's batch lands but its re-read is held; then its lease hangs: it fences."""
    del fleet
    owner.proxy.hang(kind="lease")
    owner.wait_fence_time(3 * TTL)


def test_answer_lost_to_a_fence_is_retried_once_by_the_client(
    make_fault_fleet: MakeFaultFleet,
) -> None:
    fleet = make_fault_fleet(size=2, lease_ttl=TTL, tag="xf")
    owner, peer = fleet[0], fleet[1]
    assert add_on(owner, "f", "warm") == 1
    re_read = owner.proxy.hold(kind="own", method="GET", times=1)
    results: list[object] = []
    client = patient([owner.public_url, peer.public_url])

    def call() -> None:
        try:
            results.append(client.cell("Tally", "f").add(entry="once"))
        except CallError as err:
            results.append(err)

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    re_read.wait_held(1, 10)
    hold_then_fence(fleet, owner)
    re_read.release()
    caller.join(60)
    assert results == [2], results  # the retry answered the first application's result
    assert rows([peer.public_url], "f") == ["warm", "once"]
    client.close()


def test_raw_http_retry_with_the_same_key_returns_the_first_result(
    make_fault_fleet: MakeFaultFleet,
) -> None:
    fleet = make_fault_fleet(size=2, lease_ttl=TTL, tag="xh")
    owner, peer = fleet[0], fleet[1]
    assert add_on(owner, "h", "warm") == 1
    re_read = owner.proxy.hold(kind="own", method="GET", times=1)
    headers = {"Idempotency-Key": "order-42"}
    answers: list[httpx.Response] = []

    def call() -> None:
        url = f"{owner.public_url}/cells/Tally/h/add"
        answers.append(httpx.post(url, json={"entry": "paid"}, headers=headers, timeout=40))

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    re_read.wait_held(1, 10)
    hold_then_fence(fleet, owner)
    re_read.release()
    caller.join(45)
    (first,) = answers
    assert first.status_code == 503 and first.json()["outcome"] == "unknown", first.text

    def retried() -> httpx.Response | None:
        url = f"{peer.public_url}/cells/Tally/h/add"
        resp = httpx.post(url, json={"entry": "paid"}, headers=headers, timeout=20)
        return resp if resp.status_code == 200 else None

    again = wait_for("the keyed retry to be answered", retried, 40)
    assert again.json()["result"] == 2
    conflict = httpx.post(
        f"{peer.public_url}/cells/Tally/h/add", json={"entry": "other"}, headers=headers
    )
    assert conflict.status_code == 409 and conflict.json()["outcome"] == "not_run"
    assert rows([peer.public_url], "h") == ["warm", "paid"]


def test_dropped_connection_retried_by_the_client_applies_once(
    make_fault_fleet: MakeFaultFleet,
) -> None:
    """The batch PUT is held long enough for the client's read timeout to drop the
    connection (outcome unknown); the client retries with the same key, which waits behind
    the first call and then returns its result."""
    fleet = make_fault_fleet(size=2, lease_ttl=TTL, tag="xd")
    owner = fleet[0]
    assert add_on(owner, "d", "warm") == 1
    batch = owner.proxy.hold(kind="batch", method="PUT", times=1)
    transport = CountingTransport()
    http = httpx.Client(transport=transport, timeout=httpx.Timeout(1.0, connect=3.0))
    client = Client([owner.public_url], max_attempts=10, backoff=0.2, http=http)
    results: list[object] = []

    def call() -> None:
        try:
            results.append(client.cell("Tally", "d").add(entry="slow"))
        except CallError as err:
            results.append(err)

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    batch.wait_held(1, 10)
    wait_for("a retry after the dropped first attempt", lambda: transport.sent >= 2, 10)
    batch.release()
    caller.join(40)
    assert results == [2], results
    assert rows([owner.public_url], "d") == ["warm", "slow"]
    assert len(set(transport.keys)) == 1  # every attempt carried the same key
    http.close()


class CountingTransport(httpx.HTTPTransport):
    """Counts the requests the client sends, and the idempotency keys they carry."""

    def __init__(self) -> None:
        super().__init__()
        self.sent = 0
        self.keys: list[str] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.sent += 1
        self.keys.append(request.headers.get("idempotency-key", ""))
        return super().handle_request(request)


def test_call_rerouted_through_a_peer_after_the_owner_is_killed_applies_once(
    make_fault_fleet: MakeFaultFleet,
) -> None:
    """A peer forwards the call to the owner; the owner's batch lands, its re-read is held,
    and the owner is SIGKILLed: the peer answers unknown; the client retries (same key) and,
    after another node took over, gets the first result."""
    fleet = make_fault_fleet(size=3, lease_ttl=TTL, tag="xk")
    owner, forwarder, other = fleet[0], fleet[1], fleet[2]
    assert add_on(owner, "k", "warm") == 1
    re_read = owner.proxy.hold(kind="own", method="GET", times=1)
    client = patient([forwarder.public_url, other.public_url])
    results: list[object] = []

    def call() -> None:
        try:
            results.append(client.cell("Tally", "k").add(entry="forwarded"))
        except CallError as err:
            results.append(err)

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    re_read.wait_held(1, 10)
    owner.kill()
    re_read.release()
    caller.join(60)
    assert results == [2], results
    assert rows([forwarder.public_url, other.public_url], "k") == ["warm", "forwarded"]
    client.close()


CALLS = 1000
WRITERS = 4
CELLS = ("l0", "l1", "l2")


def test_ledger_of_keyed_calls_under_kills_and_pauses_has_one_effect_per_call(
    make_fault_fleet: MakeFaultFleet,
) -> None:
    fleet = make_fault_fleet(size=3, lease_ttl=TTL, tag="xl")
    urls = [n.public_url for n in fleet]
    numbers = itertools.count()
    lock = threading.Lock()
    answered: dict[str, tuple[str, object]] = {}  # entry -> (cell, result or final error)
    stop = threading.Event()

    def writer(seed: int) -> None:
        client = Client(urls, retry_for=120.0, max_attempts=40, backoff=0.1, timeout=20)
        rng = random.Random(seed)
        while not stop.is_set():
            with lock:
                n = next(numbers)
            if n >= CALLS:
                break
            entry = f"e{n}"
            cell = rng.choice(CELLS)
            try:
                result: object = client.cell("Tally", cell).add(entry=entry)
            except CallError as err:
                result = err
            with lock:
                answered[entry] = (cell, result)
        client.close()

    disruptions: Counter[str] = Counter()

    def chaos() -> None:
        rng = random.Random(7)
        while not stop.wait(rng.uniform(1.5, 3.0)):
            node = rng.choice(list(fleet))
            how = "kill" if rng.random() < 0.5 else "pause"
            disruptions[how] += 1
            if how == "kill":
                node.kill()
                node.start()
            else:
                node.signal(signal.SIGSTOP)
                stop.wait(TTL * 1.5)
                node.signal(signal.SIGCONT)
                wait_for(
                    f"{node.node_id} to exit after its pause",
                    functools.partial(fenced_or_up, node),
                    20,
                )
                if not node.running:
                    node.start()

    threads = [threading.Thread(target=writer, args=(i,), daemon=True) for i in range(WRITERS)]
    troublemaker = threading.Thread(target=chaos, daemon=True)
    for t in threads:
        t.start()
    troublemaker.start()
    deadline = time.monotonic() + 300
    for t in threads:
        t.join(max(1.0, deadline - time.monotonic()))
    stop.set()
    troublemaker.join(60)
    assert not any(t.is_alive() for t in threads), "writers did not finish in time"
    bring_up(fleet)
    assert len(answered) == CALLS
    assert disruptions["kill"] >= 2 and disruptions["pause"] >= 2, disruptions
    seen: Counter[str] = Counter()
    for cell in CELLS:
        seen.update(rows(urls, cell))
    twice = [e for e, n in seen.items() if n > 1]
    assert not twice, f"entries applied twice: {twice[:20]}"
    lost = [e for e, (_c, r) in answered.items() if not isinstance(r, CallError) and e not in seen]
    assert not lost, f"acknowledged calls missing: {lost[:20]}"
    failed_but_present = [
        e
        for e, (_c, r) in answered.items()
        if isinstance(r, CallError) and r.outcome != "unknown" and e in seen
    ]
    assert not failed_but_present, failed_but_present[:20]
    unknown = sum(1 for _c, r in answered.values() if isinstance(r, NotDurable))
    assert unknown <= CALLS // 20, f"{unknown} calls ended unknown even with retries"


def bring_up(fleet: Iterable[FaultNode], attempts: int = 3) -> None:
    """Start every node that is down and wait until all serve. A node may fence right after a
    restart when the loaded machine starves its first renewals (it exits 3, as it must):
    start it again, a bounded number of times."""
    for node in fleet:
        for attempt in range(attempts):
            if not node.running:
                node.start()
            try:
                node.ready(40)
                break
            except RuntimeError:
                if attempt == attempts - 1:
                    raise


def fenced_or_up(node: FaultNode) -> bool:
    """After a pause past its TTL the node either fenced (and exited 3) or kept serving."""
    return not node.running or node.fence_time() is None
