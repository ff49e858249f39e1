"""A read-only call to a cell nobody created answers from scratch and creates nothing: no
``own.json``, no batch, no local file, one bucket request (the ownership record's GET)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from cellactors import CellActor, Node, read_only
from cellactors.core import keys
from cellactors.errors import MethodFailed
from cellactors.persistence.store.s3 import S3Bucket
from tests.helpers.runtime import make_node, thread_starts


class Shelf(CellActor):
    def on_activate(self) -> None:
        self.db.table("items").create({"name": str}, pk="name", if_not_exists=True)

    def add(self, name: str) -> int:
        self.db.table("items").insert({"name": name}, replace=True)
        return self.count()

    @read_only
    def count(self) -> int:
        return int(self.db.execute("SELECT count(*) FROM items").fetchone()[0])

    @read_only
    def broken(self) -> int:
        raise LookupError("nothing here")


class Needy(CellActor):
    """A cell whose ``on_activate`` needs a real activation (it calls another cell)."""

    def on_activate(self) -> None:
        self.cell(Shelf, "source").count()

    @read_only
    def ready(self) -> bool:
        return True


class Ticker(CellActor):
    """A cell whose ``on_activate`` sets an alarm: only a cell that exists can keep it."""

    def on_activate(self) -> None:
        if self.get_alarm() is None:
            self.set_alarm(self.now() + 3600)

    @read_only
    def due(self) -> float | None:
        return self.get_alarm()


@pytest.fixture
def node(sw_bucket: S3Bucket) -> Iterator[Node]:
    n = make_node(sw_bucket, "scratch")
    n.register(Shelf)
    n.register(Needy)
    n.register(Ticker)
    yield n
    n.stop()


def cell_objects(bucket: S3Bucket, cell_id: str) -> list[str]:
    return [o.key for o in bucket.list(keys.cell_root(cell_id))]


def requests_of(node: Node, call: Any) -> dict[tuple[str, str], int]:
    before = node.bucket.snapshot()
    call()
    after = node.bucket.snapshot()
    after.subtract(before)
    return {k: v for k, v in after.items() if v and k[1] != "lease"}


def test_a_read_of_a_cell_nobody_created_leaves_nothing_behind(
    node: Node, sw_bucket: S3Bucket
) -> None:
    spent = requests_of(node, lambda: node.call("Shelf", "ghost", "count") == 0 or pytest.fail())
    spent.pop(("list", "wake"), None)  # the node's periodic alarm scan, not the read's
    assert sum(spent.values()) == 1 and spent == {("get", "own"): 1}
    assert cell_objects(sw_bucket, "Shelf:ghost") == []
    assert node.activations.host("Shelf:ghost") is None
    assert not any("ghost" in p.name for p in node.activations.cells_dir.iterdir())
    # A method's failure is its answer, as on a real activation, and still nothing is made.
    with pytest.raises(MethodFailed, match="nothing here"):
        node.call("Shelf", "ghost", "broken")
    assert cell_objects(sw_bucket, "Shelf:ghost") == []


def test_a_write_creates_the_cell_and_reads_see_it_after(node: Node, sw_bucket: S3Bucket) -> None:
    assert node.call("Shelf", "real", "count") == 0
    assert node.call("Shelf", "real", "add", {"name": "x"}) == 1
    assert node.call("Shelf", "real", "count") == 1
    assert cell_objects(sw_bucket, "Shelf:real") != []


def test_reads_and_a_write_racing_on_a_new_cell_all_get_answers(node: Node) -> None:
    answers: list[Any] = []
    lock = threading.Lock()

    def run(method: str, kwargs: dict[str, Any]) -> None:
        result = node.call("Shelf", "race", method, kwargs)
        with lock:
            answers.append((method, result))

    threads = [threading.Thread(target=run, args=("count", {})) for _ in range(6)]
    threads.append(threading.Thread(target=run, args=("add", {"name": "a"})))
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(a for a in answers if a[0] == "add") == [("add", 1)]
    assert {r for m, r in answers if m == "count"} <= {0, 1} and len(answers) == 7
    assert node.call("Shelf", "race", "count") == 1  # the write is there, once


def test_a_cell_whose_activation_needs_the_node_is_activated_for_real(
    node: Node, sw_bucket: S3Bucket
) -> None:
    assert node.call("Needy", "n", "ready") is True
    assert cell_objects(sw_bucket, "Needy:n") != []


def test_a_scratch_read_starts_no_thread_of_the_cell(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    started = thread_starts(monkeypatch)
    assert node.call("Shelf", "threadless", "count") == 0
    monkeypatch.undo()
    assert [n for n in started if n.startswith("Shelf-")] == []


def test_a_cell_whose_activation_sets_an_alarm_is_created_by_a_read(
    node: Node, sw_bucket: S3Bucket
) -> None:
    """Its alarm must fire whether or not anybody writes: a scratch copy would drop it."""
    assert node.call("Ticker", "t", "due") is not None
    assert cell_objects(sw_bucket, "Ticker:t") != []
    assert [o.key for o in sw_bucket.list("wake/") if "Ticker:t" in o.key] != []
