"""A node holding a socket stops gracefully (SIGTERM): its client resumes on another node,
and the node does not wait for the socket's cell to hear of a close that did not happen.

(The stopping node's server hands each socket's handler a disconnect, 1012, before the app
shuts down: taken for the client's own close, its ``close`` event was retried by the
stopped node for 30 s, holding up the stop.)
"""

from __future__ import annotations

import json

import httpx

from cellactors.persistence.store.s3 import S3Bucket
from cellactors.socket_client import CellSocket
from tests.helpers.fleet import wait_for
from tests.helpers.served import served_node
from tests.test_chat_room import frame, load_chat

STOP_WITHIN = 15.0  # seconds; well under the 30 s a socket event is retried for


def who(url: str) -> list[str]:
    answer = httpx.post(f"{url}/cells/ChatRoom/r/who", json={}, timeout=30)
    assert answer.status_code == 200, answer.text
    names: list[str] = answer.json()["result"]
    return names


def test_a_stopping_node_lets_its_socket_resume_elsewhere_and_stops(sw_bucket: S3Bucket) -> None:
    chat = load_chat()
    with served_node(sw_bucket, "owner", classes=[chat.ChatRoom]) as owner:
        # The room lives on the owner; the socket is held by the other node.
        answer = httpx.post(f"{owner.public}/cells/ChatRoom/r/lines", json={}, timeout=30)
        assert answer.status_code == 200, answer.text
        with (
            served_node(sw_bucket, "holder", classes=[chat.ChatRoom]) as held,
            CellSocket([held.public, owner.public], "ChatRoom", "r", tags=["name:ann"]) as ann,
            CellSocket([owner.public], "ChatRoom", "r", tags=["name:bo"]) as bo,
        ):
            for sock in (ann, bo):
                assert frame(sock)["type"] == "history"
            held.runner.request_stop()  # drain and stop, as SIGTERM does
            wait_for("the holder to stop", lambda: held.exit_code is not None, STOP_WITHIN)
            # The room still has ann's socket: it resumes on the owner and misses nothing.
            bo.send(json.dumps({"id": "b-1", "text": "still there?"}))
            seen = [frame(ann) for _ in range(3)]
            assert [f["type"] for f in seen] == ["joined", "joined", "line"], seen
            assert seen[2]["text"] == "still there?"
            assert ann.resumes == 1
            ann.close()
            bo.close()
            wait_for("the room to hear both closes", lambda: who(owner.public) == [], 30)
