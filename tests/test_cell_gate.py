"""The rule of who may run a cell's code (``ExecGate``), driven without threads or a store."""

from __future__ import annotations

import pytest

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


def test_the_inbox_starts_its_thread_with_the_first_message_only() -> None:
    inbox = CellInbox()
    starts: list[int] = []
    inbox.start_on_first_put(lambda: starts.append(inbox.qsize()))
    assert starts == []  # armed: nothing runs until a message comes
    inbox.put("first")
    inbox.put("second")
    assert starts == [0]  # once, before the first message was queued
    assert [inbox.get(), inbox.get()] == ["first", "second"]


def test_a_thread_that_cannot_start_queues_nothing_and_the_next_message_tries_again() -> None:
    inbox = CellInbox()
    tries: list[str] = []

    def start() -> None:
        tries.append("start")
        if len(tries) == 1:
            raise RuntimeError("can't start new thread")

    inbox.start_on_first_put(start)
    with pytest.raises(RuntimeError):
        inbox.put("lost")
    assert inbox.qsize() == 0  # its sender is told it was not sent
    inbox.put("next")
    assert tries == ["start", "start"] and inbox.get() == "next"


def test_a_message_queued_before_the_inbox_is_armed_starts_the_thread_at_once() -> None:
    inbox = CellInbox()
    inbox.put("early")
    starts: list[str] = []
    inbox.start_on_first_put(lambda: starts.append("start"))
    assert starts == ["start"]


def test_nobody_runs_inline_while_the_cell_is_being_opened() -> None:
    _, gate, ran = _gate()
    with gate.opening():
        assert gate.run_if_idle(lambda: ran.append("read"), lambda: False) is False
    assert gate.run_if_idle(lambda: ran.append("read"), lambda: False) is True
    assert ran == ["read"]  # opening is not a message: it leaves the cell idle after it


def test_an_inbox_without_a_thread_may_handle_a_message_itself() -> None:
    inbox = CellInbox()
    starts: list[str] = []
    inbox.start_on_first_put(lambda: starts.append("start"), lambda item: item == "stop")
    inbox.put("stop")  # handled in the sender's thread: no thread, nothing queued
    assert starts == [] and inbox.qsize() == 0
    inbox.put("write")
    assert starts == ["start"] and inbox.get() == "write"


def test_closing_if_free_never_waits_for_the_code_running_inside() -> None:
    _, gate, ran = _gate()
    with gate.handling():
        assert gate.close_if_free() is False  # someone runs inside: still open
    assert gate.close_if_free() is True
    assert gate.run_if_idle(lambda: ran.append("read"), lambda: False) is False
    assert ran == []
