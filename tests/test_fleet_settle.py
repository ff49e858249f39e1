"""``Fleet.advance_alarms`` returns once what it made due has run, and ``Fleet.settle``
waits until alarms and outboxes are idle, or names what is still pending."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from cellactors import NodeSettings
from cellactors.testing import Fleet
from tests.helpers.alarm_cells import Account, Payer, Reminder


def test_advance_alarms_returns_after_the_alarms_ran(
    cellactors_fleet: Callable[..., Fleet],
) -> None:
    """No polling in the test: the hosted alarm and the orphan's (its owner killed, so only
    a scan finds it) have both fired when advance_alarms returns."""
    fleet = cellactors_fleet([Reminder], nodes=2)
    fleet.call(Reminder, "hosted", "remind", delay=3600, via=0)
    fleet.call(Reminder, "orphan", "remind", delay=3600, via=1)
    fleet.kill(1)
    fleet.advance_alarms(3601)
    assert len(fleet.call(Reminder, "hosted", "fired", via=0)) == 1
    assert len(fleet.call(Reminder, "orphan", "fired", via=0)) == 1


def test_settle_waits_for_the_outboxes(cellactors_fleet: Callable[..., Fleet]) -> None:
    fleet = cellactors_fleet([Payer, Account], nodes=2)
    fleet.call(Account, "bob", "credits", via=1)  # bob lives on the other node
    fleet.call(Payer, "p", "pay", to="bob", amounts=[5, 7], via=0)
    fleet.settle()
    assert fleet.call(Account, "bob", "credits", via=1) == [5, 7]
    assert all(not node.outbox.pending() for node in fleet.nodes)


def test_settle_names_what_is_still_pending(cellactors_fleet: Callable[..., Fleet]) -> None:
    """A message its target refuses is retried (with backoff) until its attempts run out:
    settle gives up after its timeout and says which outbox, on which node."""
    settings = NodeSettings(outbox_max_attempts=1000)
    fleet = cellactors_fleet([Payer, Account], nodes=1, settings=settings)
    fleet.call(Payer, "p", "pay", to="bob", amounts=[1], method="depositt")
    with pytest.raises(AssertionError, match=r"settle: still pending after 0\.3s: ") as info:
        fleet.settle(timeout=0.3)
    assert "node-0: the outbox of Payer:p" in str(info.value)
