"""What a hibernated cell leaves on its node: its ``Dormant`` record (ownership, file) and
its alarm mirror (so that it wakes with no bucket request), nothing else: no activation,
no actor, no connection, no route, no push or outbox state; and the collector hands the
freed heap back to the system after it puts cells away (docs/performance.md, row 16)."""

from __future__ import annotations

import gc
import sqlite3
from typing import Any, TypeVar, cast

import pytest

from cellactors.actors.cell import CellActor
from cellactors.actors.node import NodeSettings, NodeStatus, heap
from cellactors.actors.node import collector as collector_module
from cellactors.actors.node.collector import Collector
from cellactors.actors.ownership import Active, OwnershipActor
from cellactors.actors.replicator import Replicator
from cellactors.persistence.store.s3 import S3Bucket
from tests.helpers.cells import Counter
from tests.helpers.runtime import eventually, make_node

T = TypeVar("T")
CELLS = [f"Counter:m{i}" for i in range(12)]


def live(kind: type[T]) -> list[T]:
    """Objects of ``kind`` still reachable after a full collection."""
    gc.collect()
    return [o for o in gc.get_objects() if isinstance(o, kind)]


def cell_actors() -> list[object]:
    """Ownership actors and replicators of :data:`CELLS` still alive (in memory)."""
    found: list[object] = [*live(OwnershipActor), *live(Replicator)]
    return [a for a in found if getattr(a, "cell_id", None) in CELLS]


def test_hibernated_cells_leave_only_their_dormant_record_and_mirror(
    sw_bucket: S3Bucket,
) -> None:
    node = make_node(sw_bucket, "n1", hibernate_timeout=0.3)
    try:
        trims = node.collector.heap_trims
        for cid in CELLS:
            node.cell(Counter, cid.split(":", 1)[1]).increment("x")
        eventually(lambda: node.hibernated_cells() == len(CELLS), timeout=20)
        acts = node.activations
        with acts.lock:
            assert acts._hosts == {}
            assert acts._closing == {}
            assert acts._local == {}
            assert sorted(acts._dormant) == sorted(CELLS)
        assert node.routes._routes == {}
        assert node.pushes._cells == {}
        assert not set(node.outbox._workers) & set(CELLS)
        with node.alarms._cond:
            assert sorted(node.alarms._mirrors) == sorted(CELLS)  # kept: a wake writes none
        # Nothing of the open cells is left alive: actors, runtimes, connections (an idle
        # worker of the node's pool once held its last task, and with it a cell's actor).
        eventually(lambda: live(CellActor) == [], timeout=10)
        assert live(Active) == []
        dbs = [c for c in live(sqlite3.Connection) if str(node.cells_dir) in _db_path(c)]
        assert dbs == []
        eventually(lambda: cell_actors() == [], timeout=10)
        # The collector handed the freed heap back (glibc only; elsewhere it cannot).
        can_trim = heap._malloc_trim() is not None
        if can_trim:
            eventually(lambda: node.collector.heap_trims > trims, timeout=10)
        else:
            assert node.collector.heap_trims == trims
    finally:
        node.stop()


def test_release_free_heap_says_whether_the_allocator_could() -> None:
    assert heap.release_free_heap() is (heap._malloc_trim() is not None)


def _db_path(conn: sqlite3.Connection) -> str:
    """The main database file of an open connection ('' when closed)."""
    try:
        row = conn.execute("PRAGMA database_list").fetchone()
    except sqlite3.ProgrammingError:
        return ""  # closed
    return str(row[2]) if row else ""


class _Catalogue:
    """Just what the collector asks of the activation catalogue: hibernated cells, all of
    them expired (released at the next round)."""

    def __init__(self) -> None:
        self.dormant: list[str] = []

    def resident(self) -> list[tuple[str, Active]]:
        return []

    def dormant_since(self) -> list[tuple[str, float]]:
        return [(cid, 0.0) for cid in self.dormant]

    def release_dormant(self, cell_id: str) -> None:
        self.dormant.remove(cell_id)


def test_the_collector_collects_and_trims_after_rounds_that_put_cells_away(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[str] = []

    def collect() -> int:
        calls.append("gc")
        return 0

    def trim() -> bool:
        calls.append("trim")
        return True

    monkeypatch.setattr(gc, "collect", collect)
    monkeypatch.setattr(collector_module, "release_free_heap", trim)
    # However slow this machine, the rounds below fall within one collection interval.
    monkeypatch.setattr(collector_module, "COLLECT_EVERY_S", 1e9)
    catalogue = _Catalogue()
    collector = Collector(
        "n1", NodeSettings(), cast(Any, catalogue), cast(Any, None), lambda: NodeStatus.SERVING
    )

    def round_(*put_away: str) -> list[str]:
        catalogue.dormant += put_away
        calls.clear()
        assert collector.collect_once(release_after=0.0, hibernate_after=None)
        return list(calls)

    assert round_() == []  # nothing put away: nothing to hand back
    assert round_("Counter:a") == ["gc", "trim"]  # the first collection is due at once
    assert round_() == ["trim"]  # the next round trims again (actors stop a moment later)
    assert round_() == []
    assert round_("Counter:b") == ["trim"]  # within the interval of the last collection
    assert round_("Counter:c") == ["trim"]
    assert round_() == ["gc", "trim"]  # put-aways stopped: their cycles are collected
    assert round_() == []
    assert collector.heap_trims == 5
