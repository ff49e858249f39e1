"""Cells of the alarm, call-between-cells and outbox tests. Also served as an app by the
fleet tests (``--app tests/helpers/alarm_cells.py``), so it imports nothing but cellactors."""

from __future__ import annotations

from typing import Any

from cellactors import CellActor
from cellactors.errors import CallCycle, MethodFailed


class Reminder(CellActor):
    """Records every run of its alarm; ``fail_times`` makes that many runs raise first."""

    alarm_backoff_s = 0.2
    alarm_backoff_max_s = 1.0
    alarm_max_failures = 3

    def on_activate(self) -> None:
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS fired (seq INTEGER PRIMARY KEY, at REAL, tag TEXT)"
        )
        self.db.execute("CREATE TABLE IF NOT EXISTS conf (k TEXT PRIMARY KEY, v INTEGER)")

    def remind(self, delay: float, tag: str = "", fail_times: int = 0, every: float = 0) -> float:
        at = self.now() + delay
        self.set_alarm(at)
        self.db.execute("INSERT OR REPLACE INTO conf VALUES ('fail_times', ?)", [fail_times])
        self.db.execute("INSERT OR REPLACE INTO conf VALUES ('every_ms', ?)", [int(every * 1000)])
        self.db.execute("INSERT OR REPLACE INTO conf VALUES ('tag', 0)")
        self.db.execute("DELETE FROM conf WHERE k = 'attempts'")
        self.db.execute("INSERT OR REPLACE INTO conf VALUES ('tagname', ?)", [len(tag)])
        return at

    def _conf(self, key: str) -> int:
        row = self.db.execute("SELECT v FROM conf WHERE k = ?", [key]).fetchone()
        return int(row[0]) if row else 0

    def on_alarm(self) -> None:
        attempts = self._conf("attempts") + 1
        if attempts <= self._conf("fail_times"):
            raise RuntimeError(f"failing attempt {attempts}")
        self.db.execute("INSERT OR REPLACE INTO conf VALUES ('attempts', 0)")
        self.db.execute("INSERT INTO fired (at, tag) VALUES (?, 'alarm')", [self.now()])
        every = self._conf("every_ms")
        if every:
            self.set_alarm(self.now() + every / 1000)

    def fired(self) -> list[float]:
        return [r[0] for r in self.db.execute("SELECT at FROM fired ORDER BY seq")]

    def alarm(self) -> float | None:
        return self.get_alarm()

    def cancel(self) -> None:
        self.delete_alarm()

    def sql(self, statement: str) -> None:
        self.db.execute(statement)


class Flaky(CellActor):
    """An alarm that always fails: counts its attempts in a table no rollback touches."""

    alarm_backoff_s = 0.2
    alarm_backoff_max_s = 0.4
    alarm_max_failures = 3

    def arm(self, delay: float) -> None:
        self.set_alarm(self.now() + delay)

    def on_alarm(self) -> None:
        raise RuntimeError("always fails")

    def alarm(self) -> float | None:
        return self.get_alarm()


class Hop(CellActor):
    """Calls between cells: ``relay`` calls the next cell of ``path``."""

    def on_activate(self) -> None:
        self.db.execute("CREATE TABLE IF NOT EXISTS seen (seq INTEGER PRIMARY KEY, v TEXT)")

    def relay(self, path: list[str], value: str = "", fail_after: bool = False) -> Any:
        self.db.execute("INSERT INTO seen (v) VALUES (?)", [value])
        if not path:
            return [self.name]
        rest = self.cell("Hop", path[0]).relay(path=path[1:], value=value)
        if fail_after:
            raise ValueError("the outer call fails after the inner one answered")
        return [self.name, *rest]

    def probe_cycle(self, path: list[str]) -> str:
        """Call along ``path``; return the error code a cycle raised in the first callee."""
        try:
            self.cell("Hop", path[0]).relay(path=path[1:])
        except CallCycle as err:
            return f"{err.code}/{err.outcome}"
        except MethodFailed as err:
            return f"method_failed:{err.exc_type}"
        return "no cycle"

    def seen(self) -> list[str]:
        return [r[0] for r in self.db.execute("SELECT v FROM seen ORDER BY seq")]

    def post(self, to: str, values: list[str], fail: bool = False) -> list[str]:
        ids = [self.send("Inbox", to, "receive", sender=self.name, value=v) for v in values]
        if fail:
            raise ValueError("rolled back with its messages")
        return ids


class Inbox(CellActor):
    """Receives outbox messages; keeps duplicates visible (no unique constraint)."""

    def on_activate(self) -> None:
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS got (seq INTEGER PRIMARY KEY, sender TEXT, value TEXT)"
        )

    def receive(self, sender: str, value: str) -> int:
        self.db.execute("INSERT INTO got (sender, value) VALUES (?, ?)", [sender, value])
        return int(self.db.execute("SELECT count(*) FROM got").fetchone()[0])

    def got(self) -> list[list[str]]:
        return [[r[0], r[1]] for r in self.db.execute("SELECT sender, value FROM got ORDER BY seq")]


class Payer(CellActor):
    """Sends payments through the outbox to ``Account`` cells named by a string, so the
    class need not be served (or the method exist) when the message is sent."""

    def pay(self, to: str, amounts: list[int], method: str = "deposit") -> list[str]:
        return [self.send("Account", to, method, amount=a) for a in amounts]

    def sql(self, statement: str) -> list[list[Any]]:
        return [list(r) for r in self.db.execute(statement).fetchall()]


class Account(CellActor):
    """Receives payments; every credit is a row, so one applied twice shows up twice."""

    def on_activate(self) -> None:
        self.db.execute("CREATE TABLE IF NOT EXISTS credits (seq INTEGER PRIMARY KEY, amount INT)")

    def deposit(self, amount: int) -> int:
        self.db.execute("INSERT INTO credits (amount) VALUES (?)", [amount])
        return int(self.db.execute("SELECT sum(amount) FROM credits").fetchone()[0])

    def refuse(self, amount: int) -> None:
        raise ValueError(f"no payments of {amount} here")

    def credits(self) -> list[int]:
        return [r[0] for r in self.db.execute("SELECT amount FROM credits ORDER BY seq")]
