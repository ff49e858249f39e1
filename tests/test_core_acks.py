"""Tests of :class:`cellactors.core.acks.AckGate` (docs/protocol.md, "Writes and the
acknowledgement rule")."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cellactors.core.acks import AckGate, settle


def gate_with(*steps: tuple[str, object]) -> tuple[AckGate[str], list[str]]:
    """Run (op, arg) steps: ("w", name) commits the next txid and holds its response,
    ("r", name) holds a read-only response, ("a", upto) acknowledges; returns released."""
    gate: AckGate[str] = AckGate()
    released: list[str] = []
    for op, arg in steps:
        if op == "w":
            gate.commit(gate.committed + 1)
            released += gate.hold(str(arg))
        elif op == "r":
            released += gate.hold(str(arg))
        elif op == "a":
            assert isinstance(arg, int)
            released += gate.ack(arg)
        else:
            raise AssertionError(op)
    return gate, released


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        pytest.param([("r", "r0")], ["r0"], id="read on a clean gate goes at once"),
        pytest.param([("w", "w1")], [], id="write is held"),
        pytest.param([("w", "w1"), ("a", 1)], ["w1"], id="write released by its ack"),
        pytest.param([("w", "w1"), ("r", "r1")], [], id="read waits for an earlier commit"),
        pytest.param(
            [("w", "w1"), ("r", "r1"), ("a", 1)], ["w1", "r1"], id="read goes after the write"
        ),
        pytest.param(
            [("w", "w1"), ("w", "w2"), ("w", "w3"), ("a", 2)],
            ["w1", "w2"],
            id="partial ack releases a prefix",
        ),
        pytest.param(
            [("w", "w1"), ("w", "w2"), ("r", "r2"), ("w", "w3"), ("a", 2)],
            ["w1", "w2", "r2"],
            id="read between writes released with its prefix",
        ),
        pytest.param(
            [("w", "w1"), ("w", "w2"), ("a", 2), ("a", 1)],
            ["w1", "w2"],
            id="stale ack does nothing",
        ),
        pytest.param([("w", "w1"), ("a", 0)], [], id="ack of nothing"),
        pytest.param([("w", "w1"), ("a", 1), ("r", "r1")], ["w1", "r1"], id="read after ack"),
    ],
)
def test_release_order(steps: list[tuple[str, object]], expected: list[str]) -> None:
    _, released = gate_with(*steps)
    assert released == expected


def test_ack_beyond_committed_clamps() -> None:
    gate, released = gate_with(("w", "w1"), ("a", 10))
    assert released == ["w1"]
    assert gate.acked == 1 and gate.unacked == 0
    # The next commit is not acknowledged by the earlier over-reaching ack.
    gate.commit(2)
    assert gate.hold("w2") == []
    assert gate.unacked == 1
    assert gate.ack(2) == ["w2"]


def test_failure_releases_nothing_and_fails_all_held() -> None:
    gate, released = gate_with(("w", "w1"), ("a", 1), ("w", "w2"), ("r", "r2"), ("w", "w3"))
    assert released == ["w1"]
    boom = RuntimeError("fenced")
    assert gate.fail(boom) == ["w2", "r2", "w3"]
    assert gate.failed is boom
    assert gate.ack(3) == []
    assert gate.acked == 1
    with pytest.raises(RuntimeError, match="fenced"):
        gate.hold("late read")
    assert gate.fail(RuntimeError("again")) == []
    assert gate.failed is boom  # the first failure is kept


def test_commit_must_increase() -> None:
    gate: AckGate[str] = AckGate(acked=5)
    assert gate.committed == 5 and gate.unacked == 0
    for bad in (5, 4, 0):
        with pytest.raises(ValueError):
            gate.commit(bad)
    gate.commit(7)  # gaps are allowed; only the order matters
    assert gate.unacked == 2


def test_restored_gate_releases_reads_at_once() -> None:
    gate: AckGate[str] = AckGate(acked=42)
    assert gate.hold("r") == ["r"]


def test_settle_applies_in_order() -> None:
    seen: list[int] = []
    settle([3, 1, 2], seen.append)
    assert seen == [3, 1, 2]


OPS = st.lists(
    st.one_of(
        st.just(("w", 0)),
        st.just(("r", 0)),
        st.tuples(st.just("a"), st.integers(0, 12)),
        st.just(("f", 0)),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(OPS)
def test_gate_against_a_model(ops: list[tuple[str, int]]) -> None:
    """Every response is released or failed exactly once, in queue order, and only when
    everything committed before it is acknowledged; nothing is released after a failure."""
    gate: AckGate[int] = AckGate()
    needs: dict[int, int] = {}  # response id -> txid it waits for
    queue: list[int] = []
    released: list[int] = []
    failed: list[int] = []
    acked = 0
    for op, arg in ops:
        out: list[int] = []
        if op == "w" or op == "r":
            if gate.failed is not None:
                with pytest.raises(RuntimeError):
                    gate.hold(-1)
                continue
            if op == "w":
                gate.commit(gate.committed + 1)
            rid = len(needs)
            needs[rid] = gate.committed
            queue.append(rid)
            out = gate.hold(rid)
        elif op == "a":
            before = gate.acked
            out = gate.ack(arg)
            if gate.failed is None:
                acked = max(acked, min(arg, gate.committed))
                assert gate.acked == acked
            else:
                assert gate.acked == before
        else:
            was_failed = gate.failed is not None
            held = gate.fail(RuntimeError("x"))
            assert not was_failed or held == []
            failed += held
            assert held == queue[: len(held)]
            del queue[: len(held)]
            assert not queue
            continue
        if out:
            assert gate.failed is None
        for rid in out:
            assert needs[rid] <= gate.acked
        assert out == queue[: len(out)]
        del queue[: len(out)]
        released += out
        # Nothing releasable is left behind.
        if gate.failed is None and queue:
            assert needs[queue[0]] > gate.acked
    assert sorted(released + failed + queue) == list(range(len(needs)))
    assert released == sorted(released)
