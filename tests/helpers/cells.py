"""Cell classes shared by the runtime tests."""

from __future__ import annotations

import threading
from typing import Any

from cellactors import CellActor


class Counter(CellActor):
    def on_activate(self) -> None:
        self.db.table("counts").create({"name": str, "n": int}, pk="name", if_not_exists=True)

    def increment(self, name: str, by: int = 1) -> int:
        self.db.execute(
            "INSERT INTO counts (name, n) VALUES (?, ?) "
            "ON CONFLICT(name) DO UPDATE SET n = n + excluded.n",
            [name, by],
        )
        return int(self.db.execute("SELECT n FROM counts WHERE name = ?", [name]).fetchone()[0])

    def get(self, name: str) -> int:
        row = self.db.execute("SELECT n FROM counts WHERE name = ?", [name]).fetchone()
        return int(row[0]) if row else 0

    def fail_after_write(self, name: str) -> None:
        self.increment(name)
        raise ValueError("boom")

    def bad_result(self, name: str) -> Any:
        self.increment(name)
        return object()


class Sandbox(CellActor):
    """Runs arbitrary SQL: the restore-equality workloads."""

    def run(self, statements: list[str]) -> int:
        for sql in statements:
            self.db.execute(sql)
        return len(statements)

    def make_vtable(self) -> None:
        self.db.execute("CREATE VIRTUAL TABLE f USING fts5(body)")


class Slow(CellActor):
    """A cell whose call can be held open, to race stops against sends."""

    gate: Any = None  # a threading.Event set by the test
    entered = 0  # calls of hold() that started, over all Slow cells (reset by the test)
    _count_lock = threading.Lock()

    def hold(self) -> int:
        assert Slow.gate is not None
        with Slow._count_lock:  # the cells of several threads count here
            Slow.entered += 1
        Slow.gate.wait(10)
        return 1

    def get(self) -> int:
        return 2
