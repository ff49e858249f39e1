"""Idempotency keys, result checks and the runtime's call log, against a real SeaweedFS:
one effect per key on any node and after any takeover, conflicts run nothing, failures and
reads record nothing, retention by window and cap, the table is read-only to user code,
and a keyed write costs exactly what an unkeyed one does."""

from __future__ import annotations

import sqlite3
import threading
from collections import Counter as Tally
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from cellactors import CellActor, Node
from cellactors.cli import main
from cellactors.errors import FAILED, UNKNOWN, BadRequest, BadResult, KeyConflict, MethodFailed
from cellactors.persistence.celldb import calls
from cellactors.persistence.celldb.database import CellDatabase
from cellactors.persistence.store.embedded import SeaweedServer
from cellactors.persistence.store.s3 import S3Bucket
from tests.helpers.buckets import HangingBucket, delta
from tests.helpers.runtime import active_of, cell_dump, crash, eventually, make_node, owner_epoch

WALLET = "Wallet:w"


class Wallet(CellActor):
    """A balance with deposits and withdrawals that can fail, for counting effects."""

    def on_activate(self) -> None:
        self.db.execute("CREATE TABLE IF NOT EXISTS moves (id INTEGER PRIMARY KEY, amount INT)")

    def deposit(self, amount: int, memo: str = "") -> int:
        self.db.execute("INSERT INTO moves (amount) VALUES (?)", [amount])
        return self.balance()

    def withdraw(self, amount: int) -> int:
        self.db.execute("INSERT INTO moves (amount) VALUES (?)", [-amount])
        if self.balance() < 0:
            raise ValueError("insufficient funds")
        return self.balance()

    def balance(self) -> int:
        return int(self.db.execute("SELECT coalesce(sum(amount), 0) FROM moves").fetchone()[0])

    def moves(self) -> int:
        return int(self.db.execute("SELECT count(*) FROM moves").fetchone()[0])

    def deposit_all(self, amounts: list[int]) -> int:
        while amounts:  # consumes its argument: the key's digest must be taken before
            self.deposit(amounts.pop())
        return self.balance()

    def deposit_pair(self, amount: int) -> tuple[int, bytes]:
        self.deposit(amount)
        return (self.balance(), b"\x00raw")

    def recorded_keys(self) -> list[str]:
        """User code may read the runtime's table."""
        if "_cellactors_calls" not in self.db.table_names():
            return []
        return [r[0] for r in self.db.execute("SELECT key FROM _cellactors_calls ORDER BY seq")]

    def run_sql(self, sql: str) -> None:
        self.db.execute(sql)


def wallet_node(bucket: Any, node_id: str, **kw: Any) -> Node:
    node = make_node(bucket, node_id, **kw)
    node.register(Wallet)
    return node


def call(node: Node, method: str, key: str | None = None, **kwargs: Any) -> Any:
    return node.call("Wallet", "w", method, kwargs, key=key)


def committed(node: Node) -> int:
    return int(active_of(node, WALLET).runtime.channel.committed)


def test_same_key_twice_is_one_effect_with_the_same_answer(sw_bucket: S3Bucket) -> None:
    node = wallet_node(sw_bucket, "n1")
    try:
        assert call(node, "deposit", key="k1", amount=10) == 10
        txid = committed(node)
        assert call(node, "deposit", key="k1", amount=10) == 10
        # Positional and keyword spellings of one call are the same arguments.
        assert node.call("Wallet", "w", "deposit", {}, args=(10,), key="k1") == 10
        assert committed(node) == txid  # the replays committed nothing
        assert call(node, "moves") == 1
        assert call(node, "recorded_keys") == ["k1"]
        # The answer of a keyed call is what msgpack carries, the first time as on replay.
        first = call(node, "deposit_pair", key="p", amount=1)
        assert first == [11, b"\x00raw"]
        assert call(node, "deposit_pair", key="p", amount=1) == first
        assert call(node, "balance") == 11
        assert call(node, "deposit_all", key="all", amounts=[1, 2]) == 14
        assert call(node, "deposit_all", key="all", amounts=[1, 2]) == 14
        assert call(node, "balance") == 14
    finally:
        node.stop()


def test_a_key_reused_for_other_arguments_or_method_conflicts_and_runs_nothing(
    sw_bucket: S3Bucket,
) -> None:
    node = wallet_node(sw_bucket, "n1")
    try:
        assert call(node, "deposit", key="k1", amount=10) == 10
        txid = committed(node)
        with pytest.raises(KeyConflict, match="other arguments") as info:
            call(node, "deposit", key="k1", amount=11)
        assert info.value.outcome == "not_run"
        with pytest.raises(KeyConflict, match="other arguments"):
            call(node, "deposit", key="k1", amount=10, memo="x")
        with pytest.raises(KeyConflict, match="recorded for method 'deposit'"):
            call(node, "withdraw", key="k1", amount=10)
        assert committed(node) == txid
        assert call(node, "moves") == 1 and call(node, "balance") == 10
        with pytest.raises(BadRequest, match="invalid idempotency key"):
            call(node, "deposit", key="", amount=1)
        with pytest.raises(BadRequest, match="invalid idempotency key"):
            call(node, "deposit", key="x" * 256, amount=1)
    finally:
        node.stop()


def test_a_failed_call_records_nothing_and_its_retry_runs(sw_bucket: S3Bucket) -> None:
    node = wallet_node(sw_bucket, "n1")
    try:
        with pytest.raises(MethodFailed, match="insufficient funds"):
            call(node, "withdraw", key="w1", amount=5)
        assert call(node, "recorded_keys") == []
        assert call(node, "deposit", amount=10) == 10
        assert call(node, "withdraw", key="w1", amount=5) == 5  # ran this time
        assert call(node, "withdraw", key="w1", amount=5) == 5  # and only this time
        assert call(node, "balance") == 5
    finally:
        node.stop()


def test_a_read_only_keyed_call_records_nothing_and_costs_nothing(sw_bucket: S3Bucket) -> None:
    node = wallet_node(sw_bucket, "n1")
    try:
        call(node, "deposit", key="k1", amount=3)
        before = node.bucket.snapshot()
        txid = committed(node)
        assert call(node, "balance", key="r1") == 3
        assert call(node, "recorded_keys") == ["k1"]
        assert call(node, "moves", key="r1") == 1  # nothing recorded, so nothing conflicts
        assert committed(node) == txid
        assert delta(node, before) == Tally()
    finally:
        node.stop()


def test_keyed_writes_cost_one_batch_put_and_one_owner_get(sw_bucket: S3Bucket) -> None:
    node = wallet_node(sw_bucket, "n1")
    try:
        call(node, "deposit", amount=1)  # activation, outside the measurement
        one_write = Tally({("put", "batch"): 1, ("get", "own"): 1})
        before = node.bucket.snapshot()
        assert call(node, "deposit", key="k1", amount=1) == 2  # creates the call log
        assert delta(node, before) == one_write
        before = node.bucket.snapshot()
        assert call(node, "deposit", key="k2", amount=1) == 3
        assert delta(node, before) == one_write
        before = node.bucket.snapshot()
        assert call(node, "deposit", key="k2", amount=1) == 3  # replayed from the record
        with pytest.raises(KeyConflict):
            call(node, "deposit", key="k2", amount=2)
        assert delta(node, before) == Tally()
    finally:
        node.stop()


def test_a_replayed_answer_waits_for_the_record_to_be_durable(sw_bucket: S3Bucket) -> None:
    slow = HangingBucket(sw_bucket)
    node = wallet_node(slow, "n1")
    try:
        call(node, "deposit", amount=1)
        slow.hang = True
        answers: list[int] = []
        threads = [
            threading.Thread(
                target=lambda: answers.append(call(node, "deposit", key="k", amount=5)),
                daemon=True,
            )
            for _ in range(2)
        ]
        for t in threads:
            t.start()
        channel = active_of(node, WALLET).runtime.channel
        # Both calls were handled: one committed, one answered from the uncommitted record;
        # both answers are held behind the upload that hangs.
        eventually(lambda: channel.committed == 3 and len(channel.gate._held) == 2)
        assert answers == []
        slow.hang = False
        slow.release.set()
        for t in threads:
            t.join(10)
        assert answers == [6, 6]
        assert call(node, "moves") == 2
    finally:
        slow.release.set()
        node.stop()


def test_a_key_is_honoured_after_a_takeover_by_another_node(sw_bucket: S3Bucket) -> None:
    a = wallet_node(sw_bucket, "na")
    b = wallet_node(sw_bucket, "nb")
    try:
        assert call(a, "deposit", key="k1", amount=10) == 10
        assert call(a, "deposit", amount=1) == 11
        original = cell_dump(a, WALLET)
        crash(a, sw_bucket)  # abandoned without release: B takes over once the lease expired
        assert eventually(lambda: call(b, "deposit", key="k1", amount=10), timeout=10) == 10
        assert owner_epoch(b, WALLET) == ("nb", 2)
        assert cell_dump(b, WALLET) == original  # the call log is restored exactly
        with pytest.raises(KeyConflict):
            call(b, "deposit", key="k1", amount=9)
        assert call(b, "balance") == 11
    finally:
        a.stop()
        b.stop()


def test_restore_output_keeps_the_call_log(
    seaweed: SeaweedServer, sw_bucket: S3Bucket, tmp_path: Path
) -> None:
    node = wallet_node(sw_bucket, "n1")
    try:
        call(node, "deposit", key="k1", amount=4)
        out = tmp_path / "w.db"
        spec = ["--bucket", f"s3://{sw_bucket.bucket}", "--endpoint", seaweed.endpoint]
        result = CliRunner().invoke(
            main, ["restore", *spec, "--cell", WALLET, "--output", str(out)]
        )
        assert result.exit_code == 0, result.output
        with sqlite3.connect(out) as conn:
            rows = conn.execute("SELECT key, method, result FROM _cellactors_calls").fetchall()
        assert rows == [("k1", "deposit", calls.encode(4))]
    finally:
        node.stop()


def test_keys_expire_after_the_window(sw_bucket: S3Bucket) -> None:
    """Keys age on the node's runtime clock, which a test moves forward by hand."""
    node = wallet_node(sw_bucket, "n1", idempotency_window_s=60)
    try:
        assert call(node, "deposit", key="old", amount=1) == 1
        node.clock.advance(30)
        assert call(node, "deposit", key="new", amount=1) == 2
        node.clock.advance(29)  # "old" is 59-60 s old: still remembered, its answer replayed
        assert call(node, "deposit", key="old", amount=1) == 1
        node.clock.advance(2)  # past 60 s: forgotten; a retry runs again
        assert call(node, "deposit", key="old", amount=1) == 3
        assert call(node, "recorded_keys") == ["new", "old"]  # re-recorded, newest last
        node.clock.advance(61)  # both expired; an unkeyed write collects them
        assert call(node, "deposit", amount=1) == 4
        assert call(node, "recorded_keys") == []
    finally:
        node.stop()


def test_keys_beyond_the_cap_are_forgotten_oldest_first(sw_bucket: S3Bucket) -> None:
    node = wallet_node(sw_bucket, "n1", idempotency_max_keys=3)
    try:
        for i in range(5):
            assert call(node, "deposit", key=f"k{i}", amount=1) == i + 1
        assert call(node, "recorded_keys") == ["k2", "k3", "k4"]
        assert call(node, "deposit", key="k4", amount=1) == 5  # remembered
        assert call(node, "deposit", key="k0", amount=1) == 6  # forgotten: runs again
        assert call(node, "recorded_keys") == ["k3", "k4", "k0"]
    finally:
        node.stop()


def test_collection_is_bounded_per_transaction(tmp_path: Path) -> None:
    db = CellDatabase(tmp_path / "c.db")
    retention = calls.Retention(window_s=1, max_keys=100, per_txn=2)
    db.run(lambda: db.conn.execute("CREATE TABLE t (v)"))

    def record(key: str, at: int) -> Callable[[object], None]:
        def on_write(_result: object) -> None:
            db.calls.record(key, "m", "d", b"\xc0", at)

        return on_write

    def collect(_result: object) -> None:
        db.calls.collect(retention, 10_000)

    for i in range(5):
        db.run(
            lambda: db.conn.execute("INSERT INTO t VALUES (1)"), on_write=record(f"k{i}", 1000 + i)
        )
    assert db.calls.count() == 5
    for expected in (3, 1, 0):
        db.run(
            lambda: db.conn.execute("INSERT INTO t VALUES (1)"),
            on_write=collect,
        )
        assert db.calls.count() == expected
        assert db.conn.execute("SELECT count(*) FROM _cellactors_calls").fetchone()[0] == expected
    db.close()


def test_the_call_log_is_read_only_to_user_code(sw_bucket: S3Bucket) -> None:
    node = wallet_node(sw_bucket, "n1")
    try:
        call(node, "deposit", key="k1", amount=1)
        refused = [
            "INSERT INTO _cellactors_calls (key, method, args_sha256, result, at_ms) "
            "VALUES ('x', 'deposit', '', x'00', 0)",
            "UPDATE _cellactors_calls SET at_ms = 0",
            "DELETE FROM _cellactors_calls",
            "DROP TABLE _cellactors_calls",
            "ALTER TABLE _cellactors_calls ADD COLUMN z",
            "ALTER TABLE _cellactors_calls RENAME TO mine",
            "CREATE INDEX ix ON _cellactors_calls (at_ms)",
            "CREATE TRIGGER tr AFTER INSERT ON _cellactors_calls BEGIN DELETE FROM moves; END",
            "CREATE TABLE _cellactors_other (a)",
            "CREATE TEMP TABLE _cellactors_calls (a)",
        ]
        for sql in refused:
            with pytest.raises(MethodFailed, match="refused") as info:
                call(node, "run_sql", sql=sql)
            assert info.value.exc_type == "Refused", sql
        # A rename into the runtime's namespace is caught once the statement has run.
        with pytest.raises(MethodFailed, match="refused"):
            call(node, "run_sql", sql="ALTER TABLE moves RENAME TO _cellactors_moves")
        assert call(node, "recorded_keys") == ["k1"]
        assert call(node, "deposit", key="k1", amount=1) == 1
        assert call(node, "balance") == 1
    finally:
        node.stop()


def test_result_check_failure_rolls_back_with_bad_result(sw_bucket: S3Bucket) -> None:
    node = wallet_node(sw_bucket, "n1")
    try:
        assert call(node, "deposit", amount=5) == 5
        txid = committed(node)

        def refuse(result: Any) -> None:
            raise ValueError(f"{result} cannot be sent")

        with pytest.raises(BadResult, match="6 cannot be sent") as info:
            node.call("Wallet", "w", "deposit", {"amount": 1}, key="k", result_check=refuse)
        assert info.value.outcome == FAILED
        assert committed(node) == txid and call(node, "balance") == 5
        assert call(node, "recorded_keys") == []  # rolled back with the call
        seen: list[Any] = []
        assert (
            node.call("Wallet", "w", "deposit", {"amount": 1}, key="k", result_check=seen.append)
            == 6
        )
        assert seen == [6]
        # A replay is checked too; the recorded call stands, so its outcome is not "failed".
        with pytest.raises(BadResult) as replay:
            node.call("Wallet", "w", "deposit", {"amount": 1}, key="k", result_check=refuse)
        assert replay.value.outcome == UNKNOWN
        # A result msgpack cannot carry is refused the same way, before commit.
        with pytest.raises(BadResult, match="not msgpack-serializable"):
            node.call("Counter", "a", "bad_result", {"name": "x"})
        assert node.call("Counter", "a", "get", {"name": "x"}) == 0
        assert call(node, "balance") == 6
    finally:
        node.stop()


def test_argument_digests_ignore_map_order() -> None:
    one = calls.args_digest({"a": 1, "b": {"x": [1, (2, 3)], "y": None}}, (), {})
    two = calls.args_digest({"b": {"y": None, "x": [1, [2, 3]]}, "a": 1}, (), {})
    assert one == two
    assert one != calls.args_digest({"a": 1, "b": {"x": [1, [2, 3]], "y": 0}}, (), {})
    assert calls.args_digest(None, (1,), {}) != calls.args_digest({"amount": 1}, (), {})
