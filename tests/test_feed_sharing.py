"""Followers of one cell on one node share one poller (one bucket round per poll interval,
whatever their number), each still gets every transaction once and in order, and a node
caps its open follow streams (docs/feed.md: cost; docs/http-api.md#change-feed)."""

from __future__ import annotations

import contextlib
import json
import threading

import httpx

from cellactors import Node
from cellactors.core import keys
from cellactors.core.changes import Change
from cellactors.core.feed_tail import FeedTail, Next
from cellactors.persistence.store.s3 import S3Bucket
from cellactors.server.app import ServerSettings
from tests.helpers.buckets import GatedLists, delta, feed_requests
from tests.helpers.cells import Counter
from tests.helpers.metrics import parse, value
from tests.helpers.runtime import eventually, make_node
from tests.helpers.served import served_node

CELL = "Counter:a"


class Follower(threading.Thread):
    """One ``GET .../changes?wait=`` stream read line by line: the txids it received."""

    def __init__(self, base: str, after: int = 0, wait: float = 30.0) -> None:
        super().__init__(daemon=True)
        self.url = f"{base}/cells/Counter/a/changes"
        self.params = {"after": str(after), "wait": str(wait)}
        self.txids: list[int] = []
        self.errors: list[dict[str, object]] = []
        self.start()

    def run(self) -> None:
        with httpx.stream("GET", self.url, params=self.params, timeout=60) as answer:
            assert answer.status_code == 200, answer.read()
            for line in answer.iter_lines():
                record = json.loads(line)
                if "txid" in record:
                    self.txids.append(record["txid"])
                else:
                    self.errors.append(record)


def last_txid(node: Node) -> int:
    """The cell's last acknowledged txid, read from the bucket."""
    return list(node.changes("Counter", "a"))[-1].txid


def test_many_followers_of_an_idle_cell_cost_one_poller(sw_bucket: S3Bucket) -> None:
    writer = make_node(sw_bucket, "wa")  # owns the cell; the served node only reads the feed
    gate = GatedLists(sw_bucket, keys.cell_root(CELL))
    try:
        for _ in range(3):
            writer.cell(Counter, "a").increment("x")
        last = last_txid(writer)
        settings = ServerSettings(feed_poll_interval=0.05)
        with served_node(gate, "fb", settings) as served, contextlib.ExitStack() as stack:
            stack.callback(gate.open)  # a failure must not leave the node's reads held
            followers = [Follower(served.public) for _ in range(8)]
            eventually(lambda: all(f.txids[-1:] == [last] for f in followers))
            # Each round waits at the gate: the test lets K rounds through, one at a time.
            gate.close()
            eventually(lambda: gate.waiting == 1)
            before = served.node.bucket.snapshot()
            rounds = 5
            for k in range(1, rounds + 1):
                gate.allow()
                eventually(lambda k=k: gate.passed == k and gate.waiting == 1)  # type: ignore[misc]
            # Exactly what one follower costs: one LIST of the epoch folder and one GET of
            # own.json a round (docs/feed.md), for 8 followers.
            assert feed_requests(delta(served.node, before)) == {
                ("list", "other"): rounds,
                ("get", "own"): rounds,
            }
            gate.open()
            writer.cell(Counter, "a").increment("x")
            eventually(lambda: all(f.txids[-1:] == [last + 1] for f in followers))
        for f in followers:
            f.join(10)
            assert f.txids == list(range(1, last + 2)) and f.errors == []
    finally:
        gate.open()
        writer.stop()


def test_each_follower_gets_every_transaction_once_in_order(sw_bucket: S3Bucket) -> None:
    writer = make_node(sw_bucket, "wb")
    try:
        cell = writer.cell(Counter, "a")
        for _ in range(6):
            cell.increment("x")
        # Pages of 3 and a tail that keeps 3: a late follower from 0 reads on its own first.
        settings = ServerSettings(feed_poll_interval=0.05, feed_page=3)
        with served_node(sw_bucket, "fc", settings) as served:
            early = [Follower(served.public, after=a) for a in (0, 0, 5)]
            for _ in range(4):
                cell.increment("x")
            middle = last_txid(writer)
            eventually(lambda: all(f.txids[-1:] == [middle] for f in early))
            late = Follower(served.public, after=0)
            for _ in range(5):
                cell.increment("x")
            end = last_txid(writer)
            everyone = [*early, late]
            eventually(lambda: all(f.txids[-1:] == [end] for f in everyone))
        for f, after in zip(everyone, (0, 0, 5, 0), strict=True):
            f.join(10)
            assert f.txids == list(range(after + 1, end + 1)) and f.errors == []
    finally:
        writer.stop()


def test_a_stream_over_the_cap_is_refused_and_the_others_go_on(sw_bucket: S3Bucket) -> None:
    writer = make_node(sw_bucket, "wc")
    try:
        cell = writer.cell(Counter, "a")
        cell.increment("x")
        last = last_txid(writer)
        settings = ServerSettings(feed_poll_interval=0.05, max_feed_streams=2)
        with served_node(sw_bucket, "fd", settings) as served:
            followers = [Follower(served.public) for _ in range(2)]
            eventually(lambda: all(f.txids[-1:] == [last] for f in followers))
            url = f"{served.public}/cells/Counter/a/changes"
            refused = httpx.get(url, params={"wait": "5"}, timeout=10)
            assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
            body = refused.json()
            assert body["error"] == "feed_unavailable"
            assert body["outcome"] == "not_run" and body["retryable"] is True
            assert "max_feed_streams" in body["message"]
            samples = parse(served.node.metrics_text())
            assert value(samples, "cellactors_feed_streams_refused_total") == 1
            # A read without wait is no stream: still served.
            assert httpx.get(url, timeout=10).status_code == 200
            cell.increment("x")
            eventually(lambda: all(f.txids[-1:] == [last + 1] for f in followers))
        for f in followers:
            f.join(10)
            assert f.txids == list(range(1, last + 2)) and f.errors == []
    finally:
        writer.stop()


def change(txid: int) -> Change:
    return Change(txid, 1, 0, ())


def test_the_tail_serves_those_it_keeps_and_sends_others_reading() -> None:
    tail = FeedTail.starting(2, [change(3), change(4)], keep=3, due=1.0)
    assert tail.last == 4
    assert tail.next_for(4) is Next.WAIT and tail.next_for(9) is Next.WAIT
    assert tail.next_for(2) is Next.TAKE and [c.txid for c in tail.after(2)] == [3, 4]
    assert tail.next_for(1) is Next.OWN  # txid 2 is not kept
    tail.advanced([change(5), change(6)], full=False, now=2.0, interval=0.25)
    assert [c.txid for c in tail.recent] == [4, 5, 6] and tail.due == 2.25
    assert tail.next_for(2) is Next.OWN and tail.next_for(3) is Next.TAKE
    tail.advanced([change(7)], full=True, now=3.0, interval=0.25)
    assert tail.due == 3.0 and tail.rounds == 2  # a full page: the next round at once
