"""The change feed as server-sent events (``Accept: text/event-stream``): the framing alone,
and the response's heartbeats and its stall limit without a server."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import anyio
import pytest
from starlette.types import Message

from cellactors.errors import BadRequest
from cellactors.server import feed_events

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

    async def main() -> None:
        with anyio.fail_after(10):
            await response.stream_response(send)

    anyio.run(main)
    assert len(sent) == 3 and closed == [True]  # left incomplete: the server closes it
