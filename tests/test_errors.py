"""The error catalogue: one module holds every class, and every call error a node can answer
with comes back from its wire form as the same class, status, outcome and retry advice."""

from __future__ import annotations

import inspect

import pytest

from cellactors import errors
from cellactors.errors import CallError, error_from_answer


def call_errors() -> list[type[CallError]]:
    return [
        cls
        for _name, cls in inspect.getmembers(errors, inspect.isclass)
        if issubclass(cls, CallError) and cls is not CallError
    ]


def build(cls: type[CallError]) -> CallError:
    params = list(inspect.signature(cls.__init__).parameters)[1:]
    if params[:2] == ["exc_type", "message"]:
        return cls("ValueError", "no")
    if params[:1] == ["node"]:
        return cls("n2", "http://n2", "g1")
    return cls("it went wrong")


@pytest.mark.parametrize("cls", call_errors(), ids=lambda c: c.__name__)
def test_every_call_error_comes_back_from_its_wire_form(cls: type[CallError]) -> None:
    sent = build(cls)
    back = error_from_answer(sent.status, sent.to_dict())
    if cls in (errors.InternalError, errors.RemoteOwner):
        # The node's own failure shares the base's code; a redirect is followed, never
        # raised to a caller: both come back as a plain CallError with the same fields.
        assert type(back) is CallError
    else:
        assert type(back) is cls
    assert (back.code, back.outcome, back.retryable) == (cls.code, cls.outcome, cls.retryable)
    assert str(back) == str(sent)


def test_history_collected_keeps_where_to_start_again() -> None:
    sent = errors.HistoryCollected("collected")
    sent.requested, sent.oldest_txid, sent.snapshot_txid, sent.snapshot_epoch = 3, 40, 39, 2
    back = error_from_answer(410, sent.to_dict())
    assert isinstance(back, errors.HistoryCollected)
    assert (back.requested, back.oldest_txid, back.snapshot_txid, back.snapshot_epoch) == (
        3,
        40,
        39,
        2,
    )


def test_an_answer_that_is_not_ours_has_an_unknown_outcome() -> None:
    back = error_from_answer(502, "<html>bad gateway</html>")
    assert (back.status, back.outcome, back.retryable) == (502, errors.UNKNOWN, False)
