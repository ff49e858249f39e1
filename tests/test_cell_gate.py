"""The rule of who may run a cell's code (``ExecGate``), driven without threads or a store."""

from __future__ import annotations

from cellactors.actors.cell_gate import CellInbox, ExecGate


def _gate() -> tuple[CellInbox, ExecGate, list[str]]:
    inbox = CellInbox()
    return inbox, ExecGate(inbox), []


def test_an_idle_open_cell_runs_the_caller() -> None:
    _, gate, ran = _gate()
    assert gate.run_if_idle(lambda: ran.append("read"), lambda: False) is True
    assert ran == ["read"]


def test_a_queued_message_goes_first() -> None:
    inbox, gate, ran = _gate()
    inbox.put("write")
    assert gate.run_if_idle(lambda: ran.append("read"), lambda: False) is False
    assert ran == []


def test_a_message_taken_but_not_handled_yet_is_not_overtaken() -> None:
    inbox, gate, ran = _gate()
    inbox.put("write")
    assert inbox.get() == "write"  # the cell's thread holds it, about to take the lock
    assert gate.run_if_idle(lambda: ran.append("read"), lambda: False) is False
    with gate.handling():
        ran.append("write")
    assert gate.run_if_idle(lambda: ran.append("read"), lambda: False) is True
    assert ran == ["write", "read"]


def test_a_busy_cell_refuses_the_caller() -> None:
    _, gate, ran = _gate()
    with gate.handling():
        assert gate.run_if_idle(lambda: ran.append("read"), lambda: False) is False
    assert ran == []


def test_a_stopping_or_closed_cell_refuses_the_caller() -> None:
    _, gate, ran = _gate()
    assert gate.run_if_idle(lambda: ran.append("read"), lambda: True) is False
    gate.close()
    assert gate.run_if_idle(lambda: ran.append("read"), lambda: False) is False
    assert ran == []


def test_a_failing_message_still_counts_as_handled() -> None:
    inbox, gate, ran = _gate()
    inbox.put("bad")
    inbox.get()
    try:
        with gate.handling():
            raise ValueError("boom")
    except ValueError:
        pass
    assert gate.run_if_idle(lambda: ran.append("read"), lambda: False) is True
