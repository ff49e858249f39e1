"""A counter cell: ``cellactors serve --app examples/counter.py``, then

    curl -X POST localhost:8080/cells/Counter/a/increment -d '{"name":"x"}'

Each cell (``Counter:a``, ``Counter:b``, ...) has its own SQLite database holding any number
of named counters; every increment is durable in the bucket before it is answered.
"""

from __future__ import annotations

from cellactors import CellActor, read_only


class Counter(CellActor):
    """Named counters in one cell."""

    def on_activate(self) -> None:
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS counts (name TEXT PRIMARY KEY, n INTEGER NOT NULL)"
        )

    def increment(self, name: str, by: int = 1) -> int:
        """Add ``by`` to counter ``name``; return its new value."""
        self.db.execute(
            "INSERT INTO counts (name, n) VALUES (?, ?) "
            "ON CONFLICT(name) DO UPDATE SET n = n + excluded.n",
            [name, by],
        )
        return self.get(name)

    @read_only
    def get(self, name: str) -> int:
        """The value of counter ``name`` (0 when it was never incremented)."""
        row = self.db.execute("SELECT n FROM counts WHERE name = ?", [name]).fetchone()
        return int(row[0]) if row else 0
