"""Bank accounts that transfer money through the transactional outbox:
``cellactors serve --app examples/bank.py``, then

    curl -X POST localhost:8080/cells/Account/alice/open -d '{"amount": 100}'
    curl -X POST localhost:8080/cells/Account/alice/transfer \\
         -d '{"to": "bob", "amount": 30, "transfer_id": "t-1"}'
    curl -X POST localhost:8080/cells/Account/bob/statement -d '{}'

A transfer debits the sender and records a ``credit`` message to the receiver in the same
transaction: both happen, or neither. After that transaction is durable the runtime delivers
the message, retrying until the receiver acknowledges it, with the message id as the credit's
idempotency key; so the credit happens exactly once even if either side's node is killed.
Money in flight (debited, not yet credited) is visible in the sender's outbox until then.
"""

from __future__ import annotations

from typing import Any

from cellactors import CellActor, read_only


class Account(CellActor):
    """One account: its balance, the transfers it sent and the credits it received."""

    def on_activate(self) -> None:
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS balance (id INTEGER PRIMARY KEY CHECK (id = 1), "
            "amount INTEGER NOT NULL)"
        )
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS sent (transfer_id TEXT PRIMARY KEY, "
            "receiver TEXT NOT NULL, amount INTEGER NOT NULL)"
        )
        # No uniqueness on purpose: a credit applied twice would show up twice.
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS received (seq INTEGER PRIMARY KEY, "
            "transfer_id TEXT NOT NULL, sender TEXT NOT NULL, amount INTEGER NOT NULL)"
        )

    def _balance(self) -> int:
        row = self.db.execute("SELECT amount FROM balance WHERE id = 1").fetchone()
        return int(row[0]) if row else 0

    def open(self, amount: int) -> int:
        """Give a new account its opening balance (once; later calls change nothing)."""
        self.db.execute("INSERT OR IGNORE INTO balance (id, amount) VALUES (1, ?)", [amount])
        return self._balance()

    def transfer(self, to: str, amount: int, transfer_id: str) -> int:
        """Move ``amount`` to account ``to``; returns the new balance. Refused (rolled back,
        nothing sent) when the balance is short or ``transfer_id`` was used before."""
        if amount <= 0 or to == self.name:
            raise ValueError("a transfer needs a positive amount and another account")
        balance = self._balance()
        if balance < amount:
            raise ValueError(f"insufficient funds: {balance} < {amount}")
        self.db.execute(
            "INSERT INTO sent (transfer_id, receiver, amount) VALUES (?, ?, ?)",
            [transfer_id, to, amount],
        )
        self.db.execute("UPDATE balance SET amount = amount - ? WHERE id = 1", [amount])
        self.send(Account, to, "credit", transfer_id=transfer_id, sender=self.name, amount=amount)
        return balance - amount

    def credit(self, transfer_id: str, sender: str, amount: int) -> int:
        """Receive a transfer (called by the outbox, exactly once per message)."""
        self.db.execute(
            "INSERT INTO received (transfer_id, sender, amount) VALUES (?, ?, ?)",
            [transfer_id, sender, amount],
        )
        self.db.execute(
            "INSERT INTO balance (id, amount) VALUES (1, ?) "
            "ON CONFLICT(id) DO UPDATE SET amount = amount + excluded.amount",
            [amount],
        )
        return self._balance()

    @read_only
    def statement(self) -> dict[str, Any]:
        """The balance, the transfer ids sent and received, and the amount still in flight
        (sent, its credit not yet delivered)."""
        in_flight = self.db.execute(
            "SELECT count(*) FROM _cellactors_outbox"
            if "_cellactors_outbox" in self.db.table_names()
            else "SELECT 0"
        ).fetchone()[0]
        return {
            "balance": self._balance(),
            "sent": [r[0] for r in self.db.execute("SELECT transfer_id FROM sent")],
            "received": [r[0] for r in self.db.execute("SELECT transfer_id FROM received")],
            "in_flight_messages": int(in_flight),
        }
