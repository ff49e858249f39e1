"""The change feed against a real store (SeaweedFS): exactly the acknowledged transactions
across a takeover, a snapshot and a collection, never a fenced owner's late batch; follow
mode within a second; the HTTP route, the Python client, ``Node.changes`` and
``cellactors feed``."""

from __future__ import annotations

import json
import queue
import threading
import time
from typing import Any

import pytest
from click.testing import CliRunner

from cellactors import Client
from cellactors.actors.snapshots import SnapshotPolicy
from cellactors.cli import main
from cellactors.core import keys
from cellactors.core.changes import Change
from cellactors.core.txn import Txn
from cellactors.errors import CallError, HistoryCollected
from cellactors.persistence.history.batches import Batch, encode_batch
from cellactors.persistence.history.feed import FeedReader, follow_changes, read_changes
from cellactors.persistence.history.seals import read_seal
from cellactors.persistence.store.memory import MemoryBucket
from cellactors.persistence.store.s3 import S3Bucket
from tests.helpers.cells import Counter
from tests.helpers.runtime import crash, eventually, make_node
from tests.helpers.served import served_node

CELL = "Counter:a"


def counts(change: Change) -> list[int]:
    """The values of ``n`` a transaction wrote to ``counts``."""
    return [r.row["n"] for r in change.rows if r.table == "counts" and r.row is not None]


def late_batch(epoch: int, txid: int, n: int) -> bytes:
    """What a fenced owner's late upload looks like: a valid batch in its old epoch."""
    txn = Txn(
        txid,
        rows=[("counts", [1], [1, "x", n])],
        columns={"counts": ["rowid", "name", "n"]},
        ts_ms=int(time.time() * 1000),
    )
    return encode_batch(Batch(CELL, epoch, [txn]))


def test_feed_across_a_takeover_a_snapshot_and_a_collection(sw_bucket: S3Bucket) -> None:
    policy = SnapshotPolicy(every_txids=5, retain_s=0)
    a = make_node(sw_bucket, "na", snapshots=policy)
    b = None
    expected: list[tuple[int, int, list[int]]] = [(1, 1, [])]  # txid 1 creates the table
    try:
        for i in range(1, 8):
            assert a.cell(Counter, "a").increment("x") == i
            expected.append((i + 1, 1, [i]))
        seen = read_changes(sw_bucket, CELL, 0).changes
        assert seen[0].schema_change and not seen[0].rows
        crash(a, sw_bucket)
        b = make_node(sw_bucket, "nb", snapshots=policy)
        assert b.cell(Counter, "a").increment("x") == 8  # restored 1..8, sealed epoch 1
        expected.append((9, 2, [8]))
        assert read_seal(sw_bucket, CELL, 1) == 8
        # The deposed owner's upload lands after the takeover, beyond the seal.
        late = keys.batch_key(CELL, 1, 9, 9)
        sw_bucket.put(late, late_batch(1, 9, 999))
        page = read_changes(sw_bucket, CELL, 8)
        assert [(c.txid, c.epoch, counts(c)) for c in page.changes] == [(9, 2, [8])]
        for i in range(9, 14):
            assert b.cell(Counter, "a").increment("x") == i
            expected.append((i + 1, 2, [i]))
        seen += read_changes(sw_bucket, CELL, seen[-1].txid).changes

        def collected() -> bool:  # epoch 2's snapshot covers epoch 1, late batch included
            listed = [i.key for i in sw_bucket.list(keys.cell_root(CELL))]
            return not any("/e1/" in k for k in listed) and any(".e2.snap" in k for k in listed)

        eventually(collected, timeout=10)
        assert [(c.txid, c.epoch, counts(c)) for c in seen] == expected
        assert all(999 not in counts(c) for c in seen)
        # A consumer that kept its position reads on; one from the start is told where to go.
        assert read_changes(sw_bucket, CELL, 12).last_txid == 14
        with pytest.raises(HistoryCollected) as info:
            read_changes(sw_bucket, CELL, 0)
        err = info.value
        assert err.oldest_txid == 9  # epoch 2's first batch
        assert err.snapshot_txid is not None and err.snapshot_txid >= 8
        assert f"available is {err.oldest_txid}" in str(err) and "snapshot at txid" in str(err)
        tail = read_changes(sw_bucket, CELL, err.snapshot_txid).changes
        assert [(c.txid, c.epoch, counts(c)) for c in tail] == expected[err.snapshot_txid :]
    finally:
        if b is not None:
            b.stop()
        a.stop()


def test_follow_delivers_a_transaction_within_a_second_of_its_acknowledgement(
    sw_bucket: S3Bucket,
) -> None:
    node = make_node(sw_bucket, "na")
    stop = threading.Event()
    got: queue.Queue[tuple[Change, float]] = queue.Queue()

    def consume() -> None:
        for change in follow_changes(sw_bucket, CELL, 0, stop=stop):
            got.put((change, time.monotonic()))

    follower = threading.Thread(target=consume, daemon=True)
    follower.start()
    try:
        for i in range(1, 6):
            node.cell(Counter, "a").increment("x")
            acked = time.monotonic()
            while True:
                change, when = got.get(timeout=5)
                if counts(change) == [i]:
                    break
            assert when - acked < 1.0, f"txid {change.txid} arrived {when - acked:.2f}s late"
    finally:
        stop.set()
        follower.join(5)
        node.stop()


def test_node_changes_in_process(sw_bucket: S3Bucket) -> None:
    node = make_node(sw_bucket, "na")
    try:
        for _ in range(3):
            node.cell(Counter, "a").increment("x")
        assert [c.txid for c in node.changes("Counter", "a")] == [1, 2, 3, 4]
        assert [counts(c) for c in node.changes("Counter", "a", after=2)] == [[2], [3]]
        followed = node.changes("Counter", "a", after=4, follow=True, wait=5)
        node.cell(Counter, "a").increment("x")
        assert counts(next(followed)) == [4]
    finally:
        node.stop()


@pytest.mark.parametrize("encoding", ["json", "msgpack"])
def test_http_route_and_client(sw_bucket: S3Bucket, encoding: Any) -> None:
    with served_node(sw_bucket, "na") as served, Client(served.public, encoding=encoding) as c:
        for _ in range(3):
            c.cell("Counter", "a").increment(name="x")
        changes = list(c.changes("Counter", "a"))
        assert [ch.txid for ch in changes] == [1, 2, 3, 4]
        # Txid 1 creates the table; txid 2 also creates the runtime's table of idempotency
        # keys (the client sends one with every call): both ship as database images, and
        # txid 2 shows its rows all the same.
        assert [ch.schema_change for ch in changes] == [True, True, False, False]
        assert [counts(ch) for ch in changes[1:]] == [[1], [2], [3]]
        assert any(r.table == "_cellactors_calls" for r in changes[2].rows)
        # Follow: a new transaction arrives on the open stream.
        stream = c.changes("Counter", "a", after=4, follow=True, wait=5)
        threading.Timer(0.3, lambda: c.cell("Counter", "a").increment(name="x")).start()
        assert counts(next(stream)) == [4]
        stream.close()


def test_http_route_errors(sw_bucket: S3Bucket) -> None:
    import httpx

    with served_node(sw_bucket, "na") as served:
        with Client(served.public) as c:
            c.cell("Counter", "a").increment(name="x")
            c.cell("Counter", "a").increment(name="x")
        url = served.public + "/cells/Counter/a/changes"
        raw = httpx.get(url, params={"after": "1"})
        assert raw.status_code == 200
        assert raw.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(x) for x in raw.text.splitlines()]
        assert [x["txid"] for x in lines] == [2, 3]
        # Txid 2 created the runtime's call log: a schema change, its rows shown all the same.
        assert lines[0]["schema_change"]
        first = next(x for x in lines[0]["changes"] if x["table"] == "counts")
        assert first == {"table": "counts", "key": [1], "row": {"rowid": 1, "name": "x", "n": 1}}
        assert lines[1]["epoch"] == 1 and not lines[1]["schema_change"]
        row = next(x for x in lines[1]["changes"] if x["table"] == "counts")
        assert row == {"table": "counts", "key": [1], "row": {"rowid": 1, "name": "x", "n": 2}}
        assert httpx.get(url, params={"after": "-1"}).json()["error"] == "bad_request"
        assert httpx.get(url, params={"wait": "1000"}).json()["error"] == "bad_request"
        nope = httpx.get(served.public + "/cells/Nope/a/changes")
        assert nope.status_code == 404 and nope.json()["error"] == "unknown_cell"


def test_http_history_collected_is_410_with_where_to_start(sw_bucket: S3Bucket) -> None:
    import httpx

    with served_node(sw_bucket, "na") as served:
        with Client(served.public) as c:
            c.cell("Counter", "a").increment(name="x")
        # Txids 1..2 collected (deleted here by hand), txid 3 still held.
        for key in [i.key for i in sw_bucket.list(keys.cell_root(CELL) + "e1/")]:
            sw_bucket.delete(key)
        sw_bucket.put(keys.batch_key(CELL, 1, 3, 3), late_batch(1, 3, 5))
        answer = httpx.get(served.public + "/cells/Counter/a/changes")
        assert answer.status_code == 410
        body = answer.json()
        assert body["error"] == "history_collected" and body["oldest_txid"] == 3
        with Client(served.public) as c, pytest.raises(HistoryCollected) as info:
            list(c.changes("Counter", "a"))
        assert info.value.oldest_txid == 3


def test_http_history_missing_is_500_and_not_retried(sw_bucket: S3Bucket) -> None:
    import httpx

    with served_node(sw_bucket, "na") as served:
        with Client(served.public) as c:
            for _ in range(3):
                c.cell("Counter", "a").increment(name="x")  # txids 2..4 (1: on_activate)
        batches = sorted(
            i.key for i in sw_bucket.list(keys.cell_root(CELL) + "e1/") if i.key.endswith(".batch")
        )
        # on_activate's txid 1 shares the first call's batch, unless that call came late
        third = [b for b in batches if b.endswith("0000000000000003-0000000000000003.batch")]
        assert len(third) == 1 and len(batches) in (3, 4)
        sw_bucket.delete(third[0])  # txid 3: lost, not collected (txid 1 is still there)
        answer = httpx.get(served.public + "/cells/Counter/a/changes")
        assert answer.status_code == 500
        body = answer.json()
        assert body["error"] == "history_missing"
        assert body["outcome"] == "not_run" and body["retryable"] is False
        sent: list[httpx.Request] = []
        http = httpx.Client(event_hooks={"request": [sent.append]})
        with (
            Client(served.public, max_attempts=5, http=http) as c,
            pytest.raises(CallError) as info,
        ):
            list(c.changes("Counter", "a"))
        http.close()
        assert info.value.code == "history_missing" and not info.value.retryable
        assert len(sent) == 1  # raised at once: a feed_unavailable would be tried 5 times


def test_cli_feed_prints_json_lines(sw_bucket: S3Bucket, seaweed: Any) -> None:
    node = make_node(sw_bucket, "na")
    try:
        for _ in range(2):
            node.cell(Counter, "a").increment("x")
    finally:
        node.stop()
    spec = f"s3://{sw_bucket.bucket}"
    result = CliRunner().invoke(
        main,
        ["feed", "--bucket", spec, "--endpoint", seaweed.endpoint, "--cell", CELL, "--after", "1"],
    )
    assert result.exit_code == 0, result.output
    lines = [json.loads(x) for x in result.output.splitlines()]
    assert [(x["txid"], x["changes"][0]["row"]["n"]) for x in lines] == [(2, 1), (3, 2)]
    bad = CliRunner().invoke(
        main, ["feed", "--bucket", spec, "--endpoint", seaweed.endpoint, "--cell", "nope"]
    )
    assert bad.exit_code == 2 and "error:" in bad.output


class _Listings(MemoryBucket):
    """Records the prefix of every LIST."""

    def __init__(self) -> None:
        super().__init__("listings")
        self.prefixes: list[str] = []

    def list(self, prefix):  # type: ignore[no-untyped-def]
        self.prefixes.append(prefix)
        return super().list(prefix)


def test_an_idle_follower_lists_only_the_owner_epoch_folder() -> None:
    bucket = _Listings()
    node = make_node(bucket, "n1")
    try:
        for _ in range(3):
            node.cell(Counter, "a").increment("x")
        reader = FeedReader(bucket, "Counter:a")
        assert [c.txid for c in reader.read(0).changes][-1] >= 3
        last = reader.read(0).changes[-1].txid
        bucket.prefixes.clear()
        for _ in range(3):  # nothing new: each round lists e1/ only
            assert reader.read(last).changes == []
        assert bucket.prefixes == [keys.epoch_dir("Counter:a", 1)] * 3
        node.cell(Counter, "a").increment("x")
        assert [c.txid for c in reader.read(last).changes] == [last + 1]
    finally:
        node.stop()


class _SlowGets(MemoryBucket):
    """Batch GETs take a while; records how many ran at once."""

    def __init__(self) -> None:
        super().__init__("slow-gets")
        self.running = 0
        self.most = 0
        self.gets = 0
        self.slow = False
        self._count = threading.Lock()

    def get(self, key):  # type: ignore[no-untyped-def]
        if not (self.slow and key.endswith(".batch")):
            return super().get(key)
        with self._count:
            self.running += 1
            self.gets += 1
            self.most = max(self.most, self.running)
        try:
            time.sleep(0.02)  # a store round trip: what the reader overlaps
            return super().get(key)
        finally:
            with self._count:
                self.running -= 1


def test_the_feed_fetches_batches_in_parallel_and_stops_at_its_limit() -> None:
    bucket = _SlowGets()
    node = make_node(bucket, "n1")
    try:
        for _ in range(40):
            node.cell(Counter, "a").increment("x")
        bucket.slow = True
        page = FeedReader(bucket, "Counter:a").read(0)
        assert [c.txid for c in page.changes] == list(range(1, len(page.changes) + 1))
        assert len(page.changes) >= 40
        assert bucket.most > 1  # not one GET after another
        bucket.gets = 0
        limited = FeedReader(bucket, "Counter:a").read(0, limit=3)
        assert [c.txid for c in limited.changes] == [1, 2, 3]
        assert bucket.gets <= 16  # no more reads than the limit, not the whole chain
    finally:
        node.stop()
