"""Calls between cells and the transactional outbox on in-process nodes (a real SeaweedFS):
chains and cycles, the inner call's independence from the outer transaction, calls to cells
owned by another node, and messages delivered exactly once, in order, only after commit,
even when their sender's node crashes."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from cellactors.errors import CallCycle, MethodFailed
from cellactors.persistence.store.s3 import S3Bucket
from tests.helpers.alarm_cells import Hop, Inbox
from tests.helpers.alarms import CLASSES, alarm_node, owner, wakes
from tests.helpers.peers import Peers
from tests.helpers.runtime import crash, eventually
from tests.helpers.served import served_node


def test_a_call_chain_runs_and_a_cycle_fails_fast(sw_bucket: S3Bucket) -> None:
    node = alarm_node(sw_bucket, "n1")
    try:
        x = node.cell(Hop, "x")
        assert x.relay(path=["y", "z"], value="v1") == ["x", "y", "z"]
        assert node.cell(Hop, "z").seen() == ["v1"]
        # x -> y -> x: the inner call to x is refused at once (not after a timeout); y lets
        # the refusal escape, so x sees the same call_cycle, as y ran and rolled back.
        assert x.probe_cycle(path=["y", "x"]) == "call_cycle/failed"
        assert x.probe_cycle(path=["x"]) == "call_cycle/not_run"  # a cell calling itself
        with pytest.raises(CallCycle) as info:
            node.call("Hop", "x", "seen", {}, chain=("Hop:x", "Hop:y"))
        assert info.value.outcome == "not_run"
        assert "Hop:x -> Hop:y -> Hop:x" in str(info.value)
    finally:
        node.stop()


def test_a_cycle_reaches_an_http_caller_as_the_documented_409(sw_bucket: S3Bucket) -> None:
    """x -> y -> x over HTTP: the refusal escapes y and x, and the caller gets 409
    ``call_cycle`` (docs/http-api.md), not a 422 ``method_failed`` hiding it."""
    with served_node(sw_bucket, "n1", classes=CLASSES) as served:
        resp = httpx.post(f"{served.public}/cells/Hop/x/relay", json={"path": ["y", "x"]})
        assert resp.status_code == 409, resp.text
        body = resp.json()
        assert (body["error"], body["outcome"], body["retryable"]) == (
            "call_cycle",
            "failed",
            False,
        )
        assert "Hop:x -> Hop:y -> Hop:x" in body["message"]
        assert served.node.cell(Hop, "x").seen() == [] == served.node.cell(Hop, "y").seen()


def test_the_inner_call_is_not_rolled_back_by_the_outer_one(sw_bucket: S3Bucket) -> None:
    node = alarm_node(sw_bucket, "n1")
    try:
        with pytest.raises(MethodFailed, match="outer call fails"):
            node.cell(Hop, "x").relay(path=["y"], value="kept", fail_after=True)
        assert node.cell(Hop, "y").seen() == ["kept"]  # its own, acknowledged transaction
        assert node.cell(Hop, "x").seen() == []  # rolled back
    finally:
        node.stop()


def test_calls_between_cells_on_two_nodes_carry_the_chain(sw_bucket: S3Bucket) -> None:
    n1, n2 = alarm_node(sw_bucket, "n1"), alarm_node(sw_bucket, "n2")
    peers = Peers(n1, n2)
    try:
        n2.cell(Hop, "y").seen()  # y lives on n2
        assert n1.cell(Hop, "x").relay(path=["y", "z"], value="v") == ["x", "y", "z"]
        assert peers.forwards == 1
        assert owner(sw_bucket, "Hop:y")[0] == "n2"
        # x (n1) -> y (n2) -> x: refused on n1 with the chain y carried over.
        assert n1.cell(Hop, "x").probe_cycle(path=["y", "x"]) == "call_cycle/failed"
    finally:
        n1.stop()
        n2.stop()


def test_messages_leave_only_if_the_transaction_commits_in_send_order(
    sw_bucket: S3Bucket,
) -> None:
    node = alarm_node(sw_bucket, "n1")
    try:
        sender = node.cell(Hop, "s")
        with pytest.raises(MethodFailed):
            sender.post(to="i", values=["never"], fail=True)
        ids = sender.post(to="i", values=["1", "2", "3"])
        ids += sender.post(to="i", values=["4"])
        assert len(set(ids)) == 4
        inbox = node.cell(Inbox, "i")
        eventually(lambda: len(inbox.got()) == 4, timeout=10)
        assert inbox.got() == [["s", "1"], ["s", "2"], ["s", "3"], ["s", "4"]]
        eventually(lambda: wakes(sw_bucket) == [], timeout=5)  # outbox empty: entry gone
        assert node.metrics.outbox.labels("delivered")._value.get() == 4
    finally:
        node.stop()


def test_messages_of_a_crashed_sender_are_delivered_once_by_another_node(
    sw_bucket: S3Bucket,
) -> None:
    n1, n2, n3 = (alarm_node(sw_bucket, f"n{i}") for i in (1, 2, 3))
    peers = Peers(n1, n2, n3)
    try:
        n2.cell(Inbox, "i").got()  # the target lives on n2
        peers.down.add("n2")  # n1 cannot reach it: its messages stay in the outbox
        n1.cell(Hop, "s").post(to="i", values=["a", "b"])
        eventually(lambda: n1.metrics.outbox.labels("retried")._value.get() >= 1, timeout=10)
        assert ("Hop:s", 0) in wakes(sw_bucket)  # the outbox's wake entry, due at once
        crash(n1, sw_bucket)
        peers.down.clear()
        eventually(lambda: len(n2.cell(Inbox, "i").got()) == 2, timeout=15)
        assert owner(sw_bucket, "Hop:s")[0] in ("n2", "n3")
        eventually(lambda: wakes(sw_bucket) == [], timeout=10)
        assert n2.cell(Inbox, "i").got() == [["s", "a"], ["s", "b"]]
    finally:
        for n in (n1, n2, n3):
            n.stop()


def test_a_redelivered_message_has_one_effect(sw_bucket: S3Bucket) -> None:
    """The delivery's idempotency key: the same message delivered twice (a crash between
    delivery and deletion) is answered from the target's record."""
    node = alarm_node(sw_bucket, "n1")
    try:
        kwargs = {"sender": "s", "value": "once"}
        with ThreadPoolExecutor(3) as pool:  # .result() re-raises a delivery's error
            deliveries = [
                pool.submit(node.call_cell, "Inbox", "i", "receive", kwargs, key="outbox.abc")
                for _ in range(3)
            ]
            results = [d.result(timeout=30) for d in deliveries]
        assert results == [1, 1, 1]
        assert node.cell(Inbox, "i").got() == [["s", "once"]]
    finally:
        node.stop()


def _load_example(name: str) -> Any:
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "examples" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"example_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bank_example_moves_money_between_nodes_exactly_once(sw_bucket: S3Bucket) -> None:
    bank = _load_example("bank")
    n1, n2 = alarm_node(sw_bucket, "n1"), alarm_node(sw_bucket, "n2")
    Peers(n1, n2)
    try:
        alice, bob = n1.cell(bank.Account, "alice"), n2.cell(bank.Account, "bob")
        assert alice.open(amount=100) == 100 and bob.open(amount=10) == 10
        assert alice.transfer(to="bob", amount=30, transfer_id="t1") == 70
        with pytest.raises(MethodFailed, match="insufficient"):
            alice.transfer(to="bob", amount=1000, transfer_id="t2")
        eventually(lambda: bob.statement()["balance"] == 40, timeout=10)
        assert bob.statement()["received"] == ["t1"]
        eventually(lambda: alice.statement()["in_flight_messages"] == 0, timeout=10)
        assert alice.statement() == {
            "balance": 70,
            "sent": ["t1"],
            "received": [],
            "in_flight_messages": 0,
        }
    finally:
        n1.stop()
        n2.stop()


def test_chat_example_fans_out_in_order_and_tidies_with_an_alarm(sw_bucket: S3Bucket) -> None:
    chat = _load_example("chat")

    class QuickRoom(chat.Room):  # type: ignore[name-defined,misc]
        keep_seconds = 0.5

    QuickRoom.__name__ = "QuickRoom"
    node = alarm_node(sw_bucket, "n1")
    node.register(QuickRoom)
    node.register(chat.Member)
    try:
        room = node.cell(QuickRoom, "lobby")
        for member in ("ann", "bo", "cy"):
            room.join(member=member)
        for i in range(3):
            room.say(member="ann", text=f"line {i}")
        room.say(member="bo", text="hello")
        bo = node.cell(chat.Member, "bo")
        eventually(lambda: len(node.cell(chat.Member, "cy").inbox()) == 4, timeout=10)
        assert [m["text"] for m in node.cell(chat.Member, "cy").inbox()] == [
            "line 0",
            "line 1",
            "line 2",
            "hello",
        ]
        eventually(lambda: len(bo.inbox()) == 3, timeout=10)
        assert node.cell(chat.Member, "ann").inbox()[0]["text"] == "hello"
        eventually(lambda: room.history() == [], timeout=10)  # the alarm forgot them
    finally:
        node.stop()
