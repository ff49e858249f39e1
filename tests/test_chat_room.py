"""``ChatRoom`` (examples/chat.py) over WebSockets from Python, on one served node: the
history and a ``joined`` on connect, each line stored once by its id and sent to everyone,
a ``left`` when a socket closes, and a binary frame refused. Its page, across a fleet and a
node's death, is tests/browser/test_chat_page.py."""

from __future__ import annotations

import importlib.util
import json
from typing import Any

import httpx
import pytest

from cellactors.persistence.store.s3 import S3Bucket
from cellactors.socket_client import CellSocket, SocketClosed
from tests.helpers.fleet import REPO
from tests.helpers.served import served_node


def load_chat() -> Any:
    spec = importlib.util.spec_from_file_location("example_chat", REPO / "examples" / "chat.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def frame(sock: CellSocket) -> dict[str, Any]:
    data = sock.recv(timeout=20)
    assert isinstance(data, str)
    value: dict[str, Any] = json.loads(data)
    return value


def test_the_room_sends_history_lines_joins_and_leaves(sw_bucket: S3Bucket) -> None:
    chat = load_chat()
    # bo through another node: a second socket of a cell on one node gets its first pushes
    # before its hello, which CellSocket cannot take (tests/test_socket_open_races.py).
    with (
        served_node(sw_bucket, "chat-b", classes=[chat.ChatRoom]) as other,
        served_node(sw_bucket, "chat", classes=[chat.ChatRoom]) as node,
        CellSocket([node.public], "ChatRoom", "r", tags=["name:ann"]) as ann,
    ):
        assert frame(ann) == {"type": "history", "lines": [], "online": ["ann"]}
        assert frame(ann) == {"type": "joined", "name": "ann", "online": ["ann"]}
        ann.send(json.dumps({"id": "a-1", "text": " hi "}))
        hi = {"type": "line", "seq": 1, "id": "a-1", "name": "ann", "text": "hi"}
        assert frame(ann) == hi

        bo = CellSocket([other.public], "ChatRoom", "r", tags=["name:bo"])
        history = frame(bo)
        assert history["lines"] == [{k: v for k, v in hi.items() if k != "type"}]
        assert history["online"] == ["ann", "bo"]
        joined = {"type": "joined", "name": "bo", "online": ["ann", "bo"]}
        assert frame(bo) == joined
        assert frame(ann) == joined

        # Sent again (after a drop, say): stored and sent the first time only. A message
        # that is not JSON is a line without an id; an empty one is nothing.
        ann.send(json.dumps({"id": "a-1", "text": "hi"}))
        ann.send("   ")
        bo.send("plain <b>text</b>")
        plain = {
            "type": "line",
            "seq": 2,
            "id": None,
            "name": "bo",
            "text": "plain <b>text</b>",
        }
        assert frame(ann) == plain
        assert frame(bo) == plain

        # A binary frame: the room closes that socket (3003, final), the others hear.
        bo.send(b"\x00\x01")
        with pytest.raises(SocketClosed) as closed:
            frame(bo)
        assert closed.value.code == 3003
        assert frame(ann) == {"type": "left", "name": "bo", "online": ["ann"]}

        answer = httpx.post(f"{node.public}/cells/ChatRoom/r/lines", json={}, timeout=30)
        assert [line["text"] for line in answer.json()["result"]] == ["hi", "plain <b>text</b>"]
