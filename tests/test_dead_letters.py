"""Dead letters of the outbox on in-process nodes against a real SeaweedFS: a message that
cannot be delivered is given up (a typo at once after the attempt bound, a refusal or a
raising method at once, an unreachable target after the age bound), stops holding back the
later messages to its target, is logged and counted, and stays in a runtime table of its
sender (durable, restored on takeover, readable but not writable by user SQL) until it is
retried (delivered once, under its message id) or purged."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from cellactors import Node, NodeSettings
from cellactors.errors import MethodFailed, RemoteOwner
from cellactors.persistence.celldb.runtime_tables import DeadLetter
from cellactors.persistence.store.s3 import S3Bucket
from tests.helpers.alarm_cells import Account, Payer
from tests.helpers.alarms import SCAN, owner, wakes
from tests.helpers.peers import Peers
from tests.helpers.runtime import TTL, crash, eventually

OUTBOX_LOG = "cellactors.actors.outbox"


def outbox_node(
    bucket: S3Bucket, node_id: str, classes: list[Any] | None = None, **kw: Any
) -> Node:
    """A node with quick dead-letter bounds: 3 unserved refusals (about 0.6 s of retries)."""
    kw.setdefault("outbox_max_attempts", 3)
    settings = NodeSettings(
        lease_ttl=TTL, advertise=f"127.0.0.1:1{len(node_id)}", alarm_scan_interval=SCAN, **kw
    )
    return Node(bucket, node_id, classes or [Payer, Account], settings).start()


def letters(node: Node, name: str = "p") -> list[DeadLetter]:
    return node.dead_letters(Payer, name)


def one_letter(node: Node, name: str = "p") -> DeadLetter | bool:
    """The sender's only dead letter, or False while there is none (for eventually())."""
    found = letters(node, name)
    assert len(found) <= 1, found
    return found[0] if found else False


def outbox_rows(node: Node, name: str = "p") -> list[list[Any]]:
    rows: list[list[Any]] = node.cell(Payer, name).sql(
        statement="SELECT id FROM _cellactors_outbox"
    )
    return rows


def count(node: Node, result: str) -> float:
    value: float = node.metrics.outbox.labels(result)._value.get()
    return value


def test_a_typo_is_a_dead_letter_and_the_later_message_is_delivered(
    sw_bucket: S3Bucket, caplog: pytest.LogCaptureFixture
) -> None:
    node = outbox_node(sw_bucket, "n1")
    try:
        payer = node.cell(Payer, "p")
        with caplog.at_level(logging.WARNING, logger=OUTBOX_LOG):
            [typo] = payer.pay(to="bob", amounts=[5], method="depositt")
            payer.pay(to="bob", amounts=[7])  # queued behind the typo (same target)
            eventually(lambda: node.cell(Account, "bob").credits() == [7], timeout=15)
            letter = one_letter(node)  # buried durably before the 7 was sent
        assert isinstance(letter, DeadLetter)
        assert (letter.id, letter.target, letter.method) == (typo, "Account:bob", "depositt")
        assert letter.kwargs == {"amount": 5}
        assert letter.code == "unknown_method" and letter.outcome == "not_run"
        assert "depositt" in letter.reason and "3 times" in letter.reason
        assert letter.attempts == 3
        assert letter.sent_ms <= letter.first_failure_ms <= letter.dead_ms
        eventually(lambda: outbox_rows(node) == [], timeout=10)  # the 7 deleted once settled
        eventually(lambda: wakes(sw_bucket) == [], timeout=10)  # nothing left to deliver
        assert count(node, "dead_lettered") == 1
        assert count(node, "delivered") == 1
        assert count(node, "retried") == 2
        [warning] = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert typo in warning.getMessage() and "depositt" in warning.getMessage()
    finally:
        node.stop()


def test_a_refusal_or_a_raising_method_is_a_dead_letter_at_once(sw_bucket: S3Bucket) -> None:
    node = outbox_node(sw_bucket, "n1", outbox_max_attempts=100)
    try:
        node.cell(Payer, "p").pay(to="bob", amounts=[3], method="refuse")
        letter = eventually(lambda: one_letter(node), timeout=10)
        assert isinstance(letter, DeadLetter)
        assert (letter.code, letter.outcome, letter.attempts) == ("method_failed", "failed", 1)
        assert "no payments of 3 here" in letter.reason
        assert count(node, "retried") == 0
    finally:
        node.stop()


def test_an_unreachable_target_is_given_up_at_the_age_bound(sw_bucket: S3Bucket) -> None:
    n1 = outbox_node(sw_bucket, "n1", outbox_max_age=1.0, outbox_max_attempts=1)
    n2 = outbox_node(sw_bucket, "n2")
    peers = Peers(n1, n2)
    try:
        n2.cell(Account, "bob").credits()  # bob lives on n2 ...
        peers.down.add("n2")  # ... which n1 cannot reach
        n1.cell(Payer, "p").pay(to="bob", amounts=[4])
        letter = eventually(lambda: one_letter(n1), timeout=15)
        assert isinstance(letter, DeadLetter)
        assert letter.code == "node_unavailable"
        assert "undelivered for" in letter.reason
        assert letter.attempts > 1  # a transient failure does not count toward max_attempts
        assert n2.cell(Account, "bob").credits() == []
    finally:
        n1.stop()
        n2.stop()


def test_a_retry_after_the_target_is_deployed_delivers_once(sw_bucket: S3Bucket) -> None:
    node = outbox_node(sw_bucket, "n1", classes=[Payer])  # Account is not served yet
    try:
        [sent] = node.cell(Payer, "p").pay(to="bob", amounts=[9])
        letter = eventually(lambda: one_letter(node), timeout=15)
        assert isinstance(letter, DeadLetter)
        assert letter.code == "unknown_cell"
        node.register(Account)  # the deploy finished
        assert node.retry_dead_letters(Payer, "p", [sent]) == [sent]
        eventually(lambda: node.cell(Account, "bob").credits() == [9], timeout=15)
        assert letters(node) == []
        eventually(lambda: outbox_rows(node) == [], timeout=10)
        # Delivered under its message id: a second delivery of it would be answered from
        # the target's record, without running again.
        assert node.call_cell("Account", "bob", "deposit", {"amount": 9}, key=sent) == 9
        assert node.cell(Account, "bob").credits() == [9]
        assert node.retry_dead_letters(Payer, "p", [sent]) == []  # nothing left to retry
    finally:
        node.stop()


def test_purge_deletes_dead_letters_by_id_or_all(sw_bucket: S3Bucket) -> None:
    node = outbox_node(sw_bucket, "n1")
    try:
        payer = node.cell(Payer, "p")
        ids = payer.pay(to="bob", amounts=[1], method="nope")
        ids += payer.pay(to="carol", amounts=[2], method="nope")
        eventually(lambda: len(letters(node)) == 2, timeout=15)
        assert [x.id for x in letters(node)] == ids
        assert node.purge_dead_letters(Payer, "p", [ids[0], "outbox.missing"]) == [ids[0]]
        assert [x.id for x in letters(node)] == [ids[1]]
        assert node.purge_dead_letters(Payer, "p") == [ids[1]]
        assert letters(node) == []
        assert node.purge_dead_letters(Payer, "p") == []
    finally:
        node.stop()


def test_dead_letters_survive_a_takeover(sw_bucket: S3Bucket) -> None:
    n1 = outbox_node(sw_bucket, "n1")
    n2 = outbox_node(sw_bucket, "n2")
    Peers(n1, n2)
    try:
        [sent] = n1.cell(Payer, "p").pay(to="bob", amounts=[6], method="depositt")
        eventually(lambda: one_letter(n1), timeout=15)
        with pytest.raises(RemoteOwner):  # n1 owns the sender
            n2.dead_letters(Payer, "p")
        crash(n1, sw_bucket)
        [letter] = n2.dead_letters(Payer, "p")  # restored on n2 from the bucket
        assert owner(sw_bucket, "Payer:p")[0] == "n2"
        assert (letter.id, letter.method, letter.attempts) == (sent, "depositt", 3)
    finally:
        n1.stop()
        n2.stop()


def test_user_sql_reads_dead_letters_but_cannot_write_them(sw_bucket: S3Bucket) -> None:
    node = outbox_node(sw_bucket, "n1")
    try:
        payer = node.cell(Payer, "p")
        [sent] = payer.pay(to="bob", amounts=[1], method="nope")
        eventually(lambda: one_letter(node), timeout=15)
        assert payer.sql(statement="SELECT id FROM _cellactors_dead_letters") == [[sent]]
        for statement in (
            "DELETE FROM _cellactors_dead_letters",
            "UPDATE _cellactors_dead_letters SET attempts = 0",
            "INSERT INTO _cellactors_dead_letters SELECT * FROM _cellactors_dead_letters",
            "DROP TABLE _cellactors_dead_letters",
        ):
            with pytest.raises(MethodFailed, match="runtime"):
                payer.sql(statement=statement)
        assert [x.id for x in letters(node)] == [sent]
    finally:
        node.stop()
