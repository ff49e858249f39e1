"""The change feed as server-sent events (``Accept: text/event-stream``): the framing alone,
the response's heartbeats and its stall limit without a server, and over real HTTP against a
served node: txid order with ids, resuming with ``Last-Event-ID``, live transactions,
heartbeats while idle, the feed's authorization, cap and hidden tables
(docs/http-api.md, "Change feed as server-sent events")."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from starlette.testclient import TestClient
from starlette.types import Message

from cellactors import Node
from cellactors.core import keys
from cellactors.core.changes import Change
from cellactors.errors import BadRequest, FeedHole
from cellactors.persistence.history.feed import FeedPage
from cellactors.persistence.store.s3 import S3Bucket
from cellactors.server import feed_events
from cellactors.server.app import ServerSettings, build_public_app
from cellactors.server.auth import ApiKeys, Authentication
from tests.helpers.buckets import GatedLists, delta, feed_requests
from tests.helpers.cells import Counter
from tests.helpers.fake_node import KEY, FakeNode
from tests.helpers.metrics import parse, value
from tests.helpers.runtime import eventually, make_node
from tests.helpers.served import ServedNode, served_node

FAST = ServerSettings(feed_poll_interval=0.05, feed_heartbeat=0.2)
KEYS = {
    "ak_user_0123456789abcdef01": {"principal": "user", "roles": ["user"]},
    "ak_feed_0123456789abcdef01": {"principal": "reader", "roles": ["feed"]},
    "ak_root_0123456789abcdef01": {"principal": "root", "roles": ["admin"]},
}
USER, FEED, ROOT = list(KEYS)


# -- the framing, pure ------------------------------------------------------------------


def test_one_event_per_transaction_and_the_other_fields() -> None:
    record = {"txid": 7, "changes": [{"table": "t", "key": [1], "row": {"s": "a\nb"}}]}
    event = feed_events.change_event(7, record)
    head, data, end = event.split(b"\n", 2)
    assert head == b"id: 7" and end == b"\n"  # one data line, then the blank line
    assert json.loads(data.removeprefix(b"data: ")) == record
    failure = feed_events.error_event({"error": "history_missing", "retryable": False})
    assert failure.startswith(b"event: feed-error\ndata: {") and failure.endswith(b"}\n\n")
    assert feed_events.retry_field(1.5) == b"retry: 1500\n\n"
    assert feed_events.KEEP_ALIVE == b": keep-alive\n\n"


def test_which_requests_are_event_streams() -> None:
    assert feed_events.wants_events("text/event-stream")
    assert feed_events.wants_events("application/json, Text/Event-Stream;q=0.9")
    assert not feed_events.wants_events("application/x-ndjson")
    assert not feed_events.wants_events(None)


def test_last_event_id_wins_over_after_and_must_be_a_txid() -> None:
    assert feed_events.resume_from(None, 4) == 4
    assert feed_events.resume_from("", 4) == 4  # an id reset to empty: no header at all
    assert feed_events.resume_from("9", 4) == 9 and feed_events.resume_from("0", 4) == 0
    for bad in ("x", "-1", "1.5", "٣", str(2**63)):
        with pytest.raises(BadRequest):
            feed_events.resume_from(bad, 4)


# -- the response, without a server ----------------------------------------------------


def test_heartbeats_while_idle_and_the_stream_closes_its_source() -> None:
    sent: list[Message] = []
    closed: list[bool] = []

    async def source() -> AsyncIterator[bytes]:
        try:
            yield b"id: 1\ndata: {}\n\n"
            while sum(m.get("body") == feed_events.KEEP_ALIVE for m in sent) < 2:
                await anyio.sleep(0.01)
        finally:
            closed.append(True)

    async def send(message: Message) -> None:
        sent.append(message)

    response = feed_events.EventStreamResponse(
        source(), lambda: None, heartbeat=0.05, retry=2.0, stall=5.0, headers={}
    )
    anyio.run(response.stream_response, send)
    bodies = [m.get("body") for m in sent[1:]]
    assert bodies[:2] == [b"retry: 2000\n\n", b"id: 1\ndata: {}\n\n"]
    assert bodies[2:4] == [feed_events.KEEP_ALIVE] * 2 and bodies[-1] == b""
    assert sent[-1]["more_body"] is False and closed == [True]


def test_a_client_that_reads_nothing_is_dropped_after_the_stall_limit() -> None:
    closed: list[bool] = []
    sent: list[Message] = []

    async def source() -> AsyncIterator[bytes]:
        try:
            while True:
                yield b"id: 1\ndata: {}\n\n"
        finally:
            closed.append(True)

    async def send(message: Message) -> None:
        if len(sent) >= 3:  # the client's buffer is full: the write never finishes
            await anyio.sleep_forever()
        sent.append(message)

    response = feed_events.EventStreamResponse(
        source(), lambda: None, heartbeat=0.05, retry=1.0, stall=0.3, headers={}
    )
    aborted: list[bool] = []
    response.abort_connection = lambda: aborted.append(True)

    async def main() -> None:
        with anyio.fail_after(10):
            await response.stream_response(send)

    anyio.run(main)
    assert len(sent) == 3 and closed == [True]  # left incomplete
    assert aborted == [True]  # and the connection dropped, not left to drain


@pytest.mark.parametrize("value", ["9" * 20, "1" * 5000, "12a", "-1", "١٢"])
def test_a_last_event_id_that_is_no_txid_is_a_bad_request(value: str) -> None:
    with pytest.raises(BadRequest, match="Last-Event-ID"):
        feed_events.resume_from(value, 0)


class _BrokenAfterOnePage:
    """A feed reader that finds txid 1, then objects missing from the bucket."""

    def read(self, after: int, limit: int | None = None) -> FeedPage:
        if after == 0:
            return FeedPage(0, [Change(1, 1, 0)], owner_epoch=1)
        raise FeedHole("batch e1/2 is gone")


def test_a_failure_after_the_start_is_one_feed_error_event_then_the_end() -> None:
    node = FakeNode("node-a")
    node.feed_reader = lambda cell_id: _BrokenAfterOnePage()  # type: ignore[method-assign]
    app = build_public_app(node, KEY, ServerSettings(feed_page=1, feed_heartbeat=5.0))
    cls = sorted(node.classes)[0]
    with TestClient(app) as client:
        answer = client.get(f"/cells/{cls}/x/changes", headers={"accept": "text/event-stream"})
    assert answer.status_code == 200
    blocks = answer.text.split("\n\n")
    assert blocks[0] == "retry: 1000"
    head, data = blocks[1].split("\n")
    assert head == "id: 1" and json.loads(data.removeprefix("data: "))["txid"] == 1
    event, data = blocks[2].split("\n")
    assert event == "event: feed-error" and blocks[3:] == [""]
    body = json.loads(data.removeprefix("data: "))
    assert (body["error"], body["outcome"], body["retryable"]) == (
        "history_missing",
        "not_run",
        False,
    )


class _Empty:
    def read(self, after: int, limit: int | None = None) -> FeedPage:
        return FeedPage(after, [], owner_epoch=1)


def test_a_page_of_an_allowed_origin_may_resume_a_stream() -> None:
    """A reconnecting EventSource sends Last-Event-ID: across origins, the preflight admits
    it, and the stream carries the CORS headers like every answer."""
    node = FakeNode("node-a")
    node.feed_reader = lambda cell_id: _Empty()  # type: ignore[method-assign]
    settings = ServerSettings(cors_origins=("http://app.example",), feed_poll_interval=0.05)
    app = build_public_app(node, KEY, settings)
    url = f"/cells/{sorted(node.classes)[0]}/x/changes"
    origin = {"origin": "http://app.example"}
    with TestClient(app) as client:
        preflight = client.options(
            url,
            headers={
                **origin,
                "access-control-request-method": "GET",
                "access-control-request-headers": "last-event-id",
            },
        )
        assert preflight.status_code == 200
        assert "last-event-id" in preflight.headers["access-control-allow-headers"].lower()
        answer = client.get(
            url,
            params={"wait": "0.2"},
            headers={**origin, "accept": "text/event-stream", "last-event-id": "3"},
        )
    assert answer.status_code == 200 and answer.text.startswith("retry: 1000\n\n")
    assert answer.headers["access-control-allow-origin"] == "http://app.example"


# -- over HTTP ---------------------------------------------------------------------------


class Events(threading.Thread):
    """One event stream of ``Counter:a``'s feed, parsed as EventSource would: its events
    (``id``, ``event``, ``data``), comments and ``retry``, or the refusal's answer."""

    def __init__(self, base: str, params: dict[str, str], headers: dict[str, str]) -> None:
        super().__init__(daemon=True)
        self.url = f"{base}/cells/Counter/a/changes"
        self.params = params
        self.headers = {"accept": "text/event-stream", **headers}
        self.events: list[dict[str, str]] = []
        self.comments: list[str] = []
        self.retry: int | None = None
        self.answer: httpx.Response | None = None
        self.ended = False
        self.start()

    def run(self) -> None:
        with httpx.stream(
            "GET", self.url, params=self.params, headers=self.headers, timeout=30
        ) as answer:
            self.answer = answer
            if answer.status_code != 200:
                answer.read()
                return
            fields: dict[str, str] = {}
            for line in answer.iter_lines():
                if not line:
                    if fields:
                        self.events.append(fields)
                    fields = {}
                elif line.startswith(":"):
                    self.comments.append(line)
                else:
                    name, _, text = line.partition(":")
                    text = text.removeprefix(" ")
                    if name == "retry":
                        self.retry = int(text)
                    else:
                        fields[name] = text
        self.ended = True

    @property
    def ids(self) -> list[int]:
        return [int(e["id"]) for e in self.events if "id" in e]

    def records(self) -> list[dict[str, Any]]:
        return [json.loads(e["data"]) for e in self.events]


def stream(
    served: ServedNode, wait: float = 10.0, key: str | None = None, **headers: str
) -> Events:
    params = {"after": "0", "wait": str(wait)}
    if key is not None:
        headers["authorization"] = f"Bearer {key}"
    return Events(served.public, params, {k.replace("_", "-"): v for k, v in headers.items()})


def last_txid(node: Node) -> int:
    return list(node.changes("Counter", "a"))[-1].txid


def refused(events: Events) -> tuple[int, str]:
    eventually(lambda: events.answer is not None and not events.is_alive())
    assert events.answer is not None and not events.events
    return events.answer.status_code, events.answer.json()["error"]


def test_events_in_order_resumed_live_with_heartbeats(sw_bucket: S3Bucket) -> None:
    with served_node(sw_bucket, "sa", FAST) as served:
        cell = served.node.cell(Counter, "a")
        for _ in range(3):
            cell.increment("x")
        last = last_txid(served.node)
        first = stream(served)
        eventually(lambda: first.ids == list(range(1, last + 1)))
        assert first.answer is not None
        assert first.answer.headers["content-type"].startswith("text/event-stream")
        assert first.answer.headers["cache-control"] == "no-store"
        assert first.retry == 1000
        assert all(r["txid"] == i for r, i in zip(first.records(), first.ids, strict=True))
        # Idle: heartbeats, and nothing else.
        eventually(lambda: len(first.comments) >= 2)
        assert first.comments[0] == ": keep-alive" and first.ids[-1] == last
        # A write while streaming arrives on the stream.
        assert cell.increment("x") == 4
        eventually(lambda: first.ids[-1:] == [last + 1])
        assert first.records()[-1]["changes"][0]["row"]["n"] == 4
        # A reconnect with Last-Event-ID: exactly the later ones (it wins over after=0).
        resumed = stream(served, last_event_id="2")
        eventually(lambda: resumed.ids[-1:] == [last + 1])
        assert resumed.ids == list(range(3, last + 2))
        # The lifetime is bounded: the stream ends, without an error event, for a reconnect.
        short = stream(served, wait=0.5, last_event_id=str(last))
        eventually(lambda: short.ended)
        assert short.ids == [last + 1] and all("event" not in e for e in short.events)
    for events in (first, resumed):
        events.join(10)
        assert events.ended and len(events.ids) == len(set(events.ids))


def test_a_bad_start_is_400_before_any_stream_and_holds_no_slot(sw_bucket: S3Bucket) -> None:
    settings = ServerSettings(feed_poll_interval=0.05, feed_heartbeat=0.2, max_feed_streams=1)
    with served_node(sw_bucket, "sb", settings) as served:
        served.node.cell(Counter, "a").increment("x")
        for bad in (stream(served, last_event_id="abc"), stream(served, last_event_id="-1")):
            assert refused(bad) == (400, "bad_request")
            assert bad.answer is not None and "Last-Event-ID" in bad.answer.json()["message"]
        bad_after = Events(served.public, {"after": "x"}, {})
        assert refused(bad_after) == (400, "bad_request")
        # Refused before it started, so the one slot is still free.
        good = stream(served)
        eventually(lambda: good.ids == [1, 2])


def test_the_stream_cap_refuses_an_event_stream_like_any_follower(sw_bucket: S3Bucket) -> None:
    settings = ServerSettings(feed_poll_interval=0.05, feed_heartbeat=0.2, max_feed_streams=1)
    with served_node(sw_bucket, "sc", settings) as served:
        served.node.cell(Counter, "a").increment("x")
        holder = stream(served)
        eventually(lambda: holder.ids == [1, 2])
        over = stream(served)
        assert refused(over) == (503, "feed_unavailable")
        assert over.answer is not None and over.answer.headers["retry-after"] == "1"
        assert over.answer.json()["retryable"] is True
        # The JSON follower counts against the same cap.
        url = f"{served.public}/cells/Counter/a/changes"
        assert httpx.get(url, params={"wait": "5"}, timeout=10).status_code == 503
        samples = parse(served.node.metrics_text())
        assert value(samples, "cellactors_feed_streams_refused_total") == 2


def test_the_feed_role_and_hidden_tables_apply_to_events(
    sw_bucket: S3Bucket, tmp_path: Path
) -> None:
    path = tmp_path / "keys.json"
    path.write_text(json.dumps(KEYS))
    settings = ServerSettings(
        feed_poll_interval=0.05, authentication=Authentication([ApiKeys(path)])
    )
    with served_node(sw_bucket, "sd", settings) as served:
        for idem in ("k-1", "k-2"):  # recorded in the call log, a runtime table
            answer = httpx.post(
                f"{served.public}/cells/Counter/a/increment",
                json={"name": "x"},
                headers={"authorization": f"Bearer {ROOT}", "idempotency-key": idem},
                timeout=10,
            )
            assert answer.status_code == 200
        last = last_txid(served.node)
        assert refused(stream(served)) == (401, "unauthenticated")
        assert refused(stream(served, key=USER)) == (403, "forbidden")

        def tables(key: str) -> set[str]:
            events = stream(served, wait=0.5, key=key)
            eventually(lambda: events.ended)
            assert events.ids == list(range(1, last + 1))
            return {c["table"] for r in events.records() for c in r["changes"]}

        assert "counts" in tables(FEED) and "_cellactors_calls" not in tables(FEED)
        assert {"counts", "_cellactors_calls"} <= tables(ROOT)


def test_event_streams_of_an_idle_cell_share_one_poller(sw_bucket: S3Bucket) -> None:
    writer = make_node(sw_bucket, "we")  # owns the cell; the served node only reads the feed
    gate = GatedLists(sw_bucket, keys.cell_root("Counter:a"))
    try:
        writer.cell(Counter, "a").increment("x")
        last = last_txid(writer)
        with served_node(gate, "se", FAST) as served, contextlib.ExitStack() as stack:
            stack.callback(gate.open)  # a failure must not leave the node's reads held
            followers = [stream(served) for _ in range(6)]
            eventually(lambda: all(f.ids == list(range(1, last + 1)) for f in followers))
            gate.close()  # each round now waits at the gate: the test lets K through
            eventually(lambda: gate.waiting == 1)
            before = served.node.bucket.snapshot()
            rounds = 4
            for k in range(1, rounds + 1):
                gate.allow()
                eventually(lambda k=k: gate.passed == k and gate.waiting == 1)  # type: ignore[misc]
            spent = delta(served.node, before)
            # One LIST of the epoch folder and one GET of own.json a round, for six streams.
            assert feed_requests(spent) == {
                ("list", "other"): rounds,
                ("get", "own"): rounds,
            }
            gate.open()
            writer.cell(Counter, "a").increment("x")
            eventually(lambda: all(f.ids[-1:] == [last + 1] for f in followers))
        for f in followers:
            f.join(10)
            assert f.ids == list(range(1, last + 2))
    finally:
        gate.open()
        writer.stop()
