"""Read-only methods (``@read_only``): what they may not do, where they run, and that their
answers keep every guarantee of the mailbox path."""

from __future__ import annotations

import asyncio
import queue
import sqlite3
import threading
import time
from typing import Any, cast

import pykka
import pytest

import cellactors
from cellactors import CellActor, Node, read_only
from cellactors.actors.messages import Invoke
from cellactors.actors.node import collector as collector_module
from cellactors.errors import (
    FAILED,
    NOT_RUN,
    CallError,
    MethodFailed,
    NodeUnavailable,
    NotDurable,
)
from cellactors.persistence.store.s3 import S3Bucket
from cellactors.server.loop_reply import LoopReply
from tests.helpers.buckets import HangingBucket
from tests.helpers.runtime import active_of, eventually, host_of, make_node, thread_starts


class Reads(CellActor):
    """A cell whose read-only methods try everything they may not do."""

    gate: Any = None  # a threading.Event set by the test
    entered = threading.Event()
    held = threading.Event()  # set once ``hold`` runs in the cell's thread

    def on_activate(self) -> None:
        self.db.execute("CREATE TABLE IF NOT EXISTS t (k TEXT PRIMARY KEY, v INTEGER)")

    def put(self, k: str, v: int) -> int:
        self.db.execute("INSERT OR REPLACE INTO t VALUES (?, ?)", [k, v])
        return self.value(k)  # a read-only method called inside another is plain code

    def hold(self) -> int:
        assert Reads.gate is not None
        Reads.held.set()
        Reads.gate.wait(10)
        return threading.get_ident()

    @read_only
    def value(self, k: str) -> int:
        row = self.db.execute("SELECT v FROM t WHERE k = ?", [k]).fetchone()
        return int(row[0]) if row else 0

    @read_only
    def where(self) -> int:
        return threading.get_ident()

    @read_only
    def slow_value(self, k: str) -> int:
        assert Reads.gate is not None
        Reads.entered.set()
        Reads.gate.wait(10)
        return self.value(k)

    @read_only
    def sneaky_write(self, k: str) -> int:
        self.db.execute("INSERT OR REPLACE INTO t VALUES (?, 99)", [k])
        return 99

    @read_only
    def columns(self) -> list[str]:
        return [c.name for c in self.db["t"].columns]  # PRAGMA table_info: a read

    @read_only
    def sneaky_schema(self) -> None:
        self.db.execute("CREATE TABLE extra (x)")

    @read_only
    def sneaky_pragma(self, name: str = "user_version", value: int = 7) -> None:
        self.db.execute(f"PRAGMA {name} = {value}")

    @read_only
    def sneaky_bypass(self) -> None:
        # An authorizer that allows everything (Python 3.10 reads None as "deny all").
        self.db.conn.set_authorizer(lambda *_args: sqlite3.SQLITE_OK)
        self.db.execute("CREATE TABLE extra (x)")

    @read_only
    def leave(self) -> None:
        raise SystemExit(3)

    @read_only
    def alarm_at(self) -> float | None:
        return self.get_alarm()

    def set_at(self, at: float) -> None:
        self.set_alarm(at)

    @read_only
    def sneaky_alarm(self) -> None:
        self.set_alarm(0)

    @read_only
    def sneaky_send(self) -> None:
        self.send(Reads, "other", "put", k="a", v=1)

    @read_only
    def sneaky_call(self) -> int:
        return int(self.cell(Reads, "other").value(k="a"))


@pytest.fixture
def node(sw_bucket: S3Bucket) -> Any:
    # A long lease: these tests race reads against put-aways, not lease renewals, and a
    # renewal starved past TTL 5 s on a loaded machine fences the node (rightly).
    n = make_node(sw_bucket, "n1", ttl=30.0)
    n.register(Reads)
    yield n
    n.stop()


def test_the_marker_is_public_and_listed_per_class() -> None:
    assert cellactors.read_only is read_only
    assert Reads.read_only_methods() == {
        "value",
        "where",
        "slow_value",
        "columns",
        "sneaky_write",
        "sneaky_pragma",
        "sneaky_bypass",
        "leave",
        "alarm_at",
        "sneaky_schema",
        "sneaky_alarm",
        "sneaky_send",
        "sneaky_call",
    }
    assert "put" in Reads.exposed_methods() and "put" not in Reads.read_only_methods()


@pytest.mark.parametrize(
    ("method", "message"),
    [
        ("sneaky_write", "may not write"),
        ("sneaky_schema", "may not write"),
        ("sneaky_pragma", "may not write"),
        ("sneaky_bypass", "may not write"),
        ("sneaky_alarm", "cannot set alarms or send messages"),
        ("sneaky_send", "cannot set alarms or send messages"),
        ("sneaky_call", "cannot call other cells"),
    ],
)
def test_a_read_only_method_that_writes_or_reaches_out_fails_and_changes_nothing(
    node: Node, method: str, message: str
) -> None:
    assert node.call("Reads", "a", "put", {"k": "a", "v": 1}) == 1
    requests = node.bucket.snapshot()
    with pytest.raises(MethodFailed, match=message) as err:
        node.call("Reads", "a", method, {"k": "a"} if method == "sneaky_write" else {})
    assert err.value.outcome == FAILED  # it ran and was rolled back
    assert node.call("Reads", "a", "value", {"k": "a"}) == 1
    after = node.bucket.snapshot()
    after.subtract(requests)
    assert {k: v for k, v in after.items() if v and k[1] != "lease"} == {}  # nothing shipped
    # the cell still works, on the mailbox path too
    assert node.call("Reads", "a", "put", {"k": "a", "v": 2}) == 2


def test_a_read_only_method_may_read_the_schema_and_the_alarm(node: Node) -> None:
    assert node.call("Reads", "a", "columns") == ["k", "v"]
    assert node.call("Reads", "a", "alarm_at") is None
    node.call("Reads", "a", "set_at", {"at": 4_000_000_000})
    assert node.call("Reads", "a", "alarm_at") == 4_000_000_000


@pytest.mark.parametrize(
    ("name", "value"),
    [("query_only", 1), ("foreign_keys", 1), ("soft_heap_limit", 1000), ("cache_size", 5)],
)
def test_a_read_only_method_may_not_set_a_pragma(node: Node, name: str, value: int) -> None:
    """Settings outlive the call (the connection's, or the process's): refused, not only
    the pragmas that write the file."""
    node.call("Reads", "a", "put", {"k": "a", "v": 1})
    with pytest.raises(MethodFailed, match="may not write"):
        node.call("Reads", "a", "sneaky_pragma", {"name": name, "value": value})
    assert node.call("Reads", "a", "put", {"k": "a", "v": 2}) == 2  # writes still work


def test_a_read_only_method_raising_systemexit_fails_the_call_not_the_caller(
    node: Node,
) -> None:
    node.call("Reads", "a", "put", {"k": "a", "v": 1})
    with pytest.raises(MethodFailed, match="SystemExit") as err:
        node.call("Reads", "a", "leave")  # inline: in this very thread
    assert err.value.outcome == FAILED
    assert node.call("Reads", "a", "value", {"k": "a"}) == 1


def test_an_idle_cell_answers_a_read_only_call_in_the_callers_thread(node: Node) -> None:
    node.call("Reads", "a", "put", {"k": "a", "v": 1})
    assert node.call("Reads", "a", "where") == threading.get_ident()


def cell_threads(before: set[threading.Thread]) -> list[threading.Thread]:
    """Cell actor threads of ``Reads`` started since ``before`` was taken."""
    return [t for t in threading.enumerate() if t not in before and t.name.startswith("Reads-")]


def created(node: Node, names: list[str]) -> None:
    """Cells that exist in the bucket but are not active here: written once, then released
    (a read of a cell nobody created would activate nothing: tests/test_scratch_reads.py)."""
    for name in names:
        assert node.call("Reads", name, "put", {"k": "a", "v": 0}) == 0
        assert node.passivate(f"Reads:{name}")
    eventually(lambda: all(node.activations.active(f"Reads:{n}") is None for n in names), 10)


def test_a_cell_only_read_holds_no_thread_until_its_first_write(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(collector_module, "TRIM_AFTER_S", 0.1)
    created(node, ["a"])
    before = set(threading.enumerate())
    # Activated by a read: the restore runs in the activating thread, the read in this
    # one; the idle trim runs in the node's reaper.
    assert node.call("Reads", "a", "where") == threading.get_ident()
    active = active_of(node, "Reads:a")
    assert active is not None
    eventually(lambda: active.runtime.database.trims == 1, timeout=5)
    assert cell_threads(before) == []
    assert node.call("Reads", "a", "put", {"k": "a", "v": 1}) == 1
    assert len(cell_threads(before)) == 1  # a write goes through the mailbox: it starts one


def test_a_fence_stops_cells_only_read_without_starting_their_threads(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    names = [f"r{i}" for i in range(20)]
    created(node, names)
    started = thread_starts(monkeypatch)
    for name in names:
        assert node.call("Reads", name, "value", {"k": "a"}) == 0
    cells = []
    for name in names:
        active = active_of(node, f"Reads:{name}")
        assert active is not None
        cells.append(active.cell)
    node.fence("test: fenced")
    eventually(lambda: not any(cell.is_alive() for cell in cells), timeout=5)
    assert [n for n in started if n.startswith("Reads-")] == []  # not one, for twenty stops


def test_a_busy_cell_takes_the_read_only_call_in_its_own_thread(node: Node) -> None:
    Reads.gate = threading.Event()
    Reads.held.clear()
    node.call("Reads", "a", "put", {"k": "a", "v": 1})
    answers: dict[str, int] = {}

    def call(method: str) -> None:
        answers[method] = node.call("Reads", "a", method)

    holder = threading.Thread(target=call, args=("hold",), daemon=True)
    holder.start()
    active = active_of(node, "Reads:a")
    inbox = cast(queue.Queue[Any], active.cell.actor_inbox)
    assert Reads.held.wait(10)  # the cell's thread is busy in ``hold``
    assert inbox.qsize() == 0
    reader = threading.Thread(target=call, args=("where",), daemon=True)
    reader.start()
    eventually(lambda: inbox.qsize() == 1)  # queued, not run inline
    Reads.gate.set()
    holder.join(10)
    reader.join(10)
    assert answers["where"] == answers["hold"]  # the cell's own thread ran both
    assert answers["where"] != reader.ident


def test_an_inline_read_answers_only_after_the_writes_it_saw_are_durable(
    sw_bucket: S3Bucket,
) -> None:
    slow = HangingBucket(sw_bucket)
    node = make_node(slow, "n1")
    node.register(Reads)
    try:
        assert node.call("Reads", "a", "put", {"k": "a", "v": 1}) == 1
        slow.hang = True
        results: dict[str, int] = {}
        wrote, read = threading.Event(), threading.Event()

        def write() -> None:
            results["write"] = node.call("Reads", "a", "put", {"k": "a", "v": 2})
            wrote.set()

        def read_() -> None:
            results["read"] = node.call("Reads", "a", "value", {"k": "a"})
            results["thread"] = node.call("Reads", "a", "where")
            results["reader"] = threading.get_ident()
            read.set()

        threading.Thread(target=write, daemon=True).start()
        eventually(lambda: node.state()["cells"][0]["committed_txid"] == 3)
        threading.Thread(target=read_, daemon=True).start()
        assert not read.wait(0.5)  # it saw v=2, which is not durable yet
        slow.hang = False
        slow.release.set()
        assert wrote.wait(10) and read.wait(10)
        assert results["write"] == 2 and results["read"] == 2
        assert results["thread"] == results["reader"]  # and it did run inline
    finally:
        slow.release.set()
        node.stop()


def test_a_read_only_call_after_the_lease_deadline_fences_instead_of_answering(
    node: Node,
) -> None:
    """The lease rule holds for calls that run inline too: a process whose lease deadline
    passed (resumed after a pause) answers no read from its local state."""
    fenced = threading.Event()
    node.on_fence = lambda reason: fenced.set()
    node.call("Reads", "a", "put", {"k": "a", "v": 1})
    node.deadline.value = time.monotonic() - 1

    async def submitted() -> object:
        return node.submit_here(
            "Reads", "a", "value", {"k": "a"}, reply=LoopReply(asyncio.get_running_loop())
        )

    assert asyncio.run(submitted()) is None  # not run inline: sent to the blocking path
    with pytest.raises(NodeUnavailable):
        node.call("Reads", "a", "value", {"k": "a"})
    assert fenced.is_set() and node.status == "fenced"


def test_the_http_path_runs_a_read_only_call_on_the_event_loop(node: Node) -> None:
    node.call("Reads", "a", "put", {"k": "a", "v": 7})

    async def first() -> None:
        reply = LoopReply(asyncio.get_running_loop())
        assert node.submit_here("Reads", "a", "where", {}, reply=reply) is None

    asyncio.run(first())  # not proven quick yet: refused, for a worker thread to run
    for _ in range(3):
        node.call("Reads", "a", "where", {})
        node.call("Reads", "a", "value", {"k": "a"})

    async def main() -> tuple[int, int, int]:
        loop = asyncio.get_running_loop()
        reply = LoopReply(loop)
        sub = node.submit_here("Reads", "a", "where", {}, reply=reply)
        assert sub is not None and reply.answered  # ran before submit_here returned
        assert await reply.wait(1.0)
        where = node.answer(sub)
        reply = LoopReply(loop)
        sub = node.submit_here("Reads", "a", "value", {"k": "a"}, reply=reply)
        assert sub is not None and await reply.wait(1.0)
        return where, threading.get_ident(), node.answer(sub)

    where, loop_thread, value = asyncio.run(main())
    assert where == loop_thread and value == 7


def _invoke(method: str, **kwargs: Any) -> Invoke:
    return Invoke(method, (), kwargs, pykka.ThreadingFuture())


def test_a_stopped_cell_runs_nothing_inline(node: Node) -> None:
    node.call("Reads", "a", "put", {"k": "a", "v": 1})
    active = active_of(node, "Reads:a")
    assert active is not None and active.runtime.run_inline is not None
    assert node.passivate("Reads:a")
    invoke = _invoke("value", k="a")
    # A caller that looked the cell up before it was put away: its database is closed.
    assert active.runtime.run_inline(invoke) is False
    assert not invoke.started
    assert node.call("Reads", "a", "value", {"k": "a"}) == 1  # routed again: reactivated


def test_putting_a_cell_away_waits_for_the_read_running_inline(node: Node) -> None:
    Reads.gate = threading.Event()
    Reads.entered.clear()
    node.call("Reads", "a", "put", {"k": "a", "v": 3})
    active = active_of(node, "Reads:a")
    assert active is not None and active.runtime.run_inline is not None
    invoke = _invoke("slow_value", k="a")
    reader = threading.Thread(target=active.runtime.run_inline, args=(invoke,), daemon=True)
    reader.start()
    assert Reads.entered.wait(10)
    put_away = threading.Thread(target=node.hibernate, args=("Reads:a",), daemon=True)
    put_away.start()
    # The cell's stop waits for the read: its database stays open under it.
    put_away.join(0.3)
    assert put_away.is_alive()
    Reads.gate.set()
    reader.join(10)
    put_away.join(10)
    assert invoke.reply.get(timeout=10) == 3
    assert not put_away.is_alive() and node.hibernated_cells() == 1


def test_a_reset_waits_for_the_read_running_inline_before_it_drops_the_file(
    node: Node,
) -> None:
    """A reset stops the cell without waiting for it (it may be stuck), then drops its file
    once the actor is stopped: that must also wait for a read running in a caller's
    thread, which would otherwise meet a closed, deleted database."""
    Reads.gate = threading.Event()
    Reads.entered.clear()
    node.call("Reads", "a", "put", {"k": "a", "v": 3})
    host = host_of(node, "Reads:a")
    assert host.active is not None
    path = host.active.runtime.database.path
    answers: list[object] = []

    def read() -> None:
        try:
            answers.append(node.call("Reads", "a", "slow_value", {"k": "a"}))
        except CallError as err:
            answers.append(err)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert Reads.entered.wait(10)
    node.activations.reset(host, NotDurable("test: an upload could not be proven"))
    eventually(lambda: host.active is not None and not host.active.cell.is_alive())
    reader.join(0.3)
    assert path.exists()  # not while the read runs on it
    Reads.gate.set()
    reader.join(10)
    eventually(lambda: not path.exists())
    # The read ran on an open database; its answer is held behind the reset's failure.
    assert len(answers) == 1 and isinstance(answers[0], NotDurable), answers


def test_inline_reads_racing_hibernation_and_passivation_lose_nothing(node: Node) -> None:
    """Reads run inline while the cell is put away and woken again and again: each one
    answers the value, or says truthfully that it ran nowhere; none touches a closed
    database."""
    node.call("Reads", "a", "put", {"k": "a", "v": 5})
    stop = threading.Event()
    seen: list[object] = []

    def reader() -> None:
        while not stop.is_set():
            try:
                seen.append(node.call("Reads", "a", "value", {"k": "a"}))
            except CallError as err:  # ran nowhere: allowed, if it says so
                seen.append(NOT_RUN if err.outcome == NOT_RUN else err)
            except Exception as err:  # anything else fails the test
                seen.append(err)

    threads = [threading.Thread(target=reader, daemon=True) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        for i in range(30):
            put_away = node.hibernate if i % 2 else node.passivate
            put_away("Reads:a")
            count = len(seen)

            def more(count: int = count) -> bool:
                return len(seen) > count + 3

            eventually(more)
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    failures = [s for s in seen if s not in (5, NOT_RUN)]
    assert failures == []
    assert seen.count(5) > 30
    assert node.call("Reads", "a", "put", {"k": "a", "v": 6}) == 6
