"""``cellactors.testing``: a user's failover test in well under 2 s, pause and drain."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

import pytest

from cellactors import NodeSettings
from cellactors.errors import NodeUnavailable
from cellactors.testing import Fleet, NodeDown
from tests.helpers.alarm_cells import Account, Hop, Payer, Reminder
from tests.helpers.cells import Counter
from tests.helpers.runtime import eventually


def test_failover_test_runs_in_under_two_seconds(cellactors_fleet: Callable[..., Fleet]) -> None:
    started = time.monotonic()
    fleet = cellactors_fleet([Counter], nodes=3)
    counter = fleet.cell(Counter, "a")
    for i in range(1, 6):
        assert counter.increment("x") == i
    owner = fleet.owner(Counter, "a")
    assert owner == "node-0"
    fleet.kill(owner)
    assert fleet.cell(Counter, "a", via=1).increment("x") == 6  # took over, nothing lost
    assert fleet.owner(Counter, "a") == "node-1"
    assert fleet.acknowledged(Counter, "a") == {"counts": [{"name": "x", "n": 6}]}
    assert [c.epoch for c in fleet.changes(Counter, "a")][-1] == 2
    with pytest.raises(NodeDown):
        fleet.call(Counter, "a", "get", "x", via=0)
    fleet.close()
    assert time.monotonic() - started < 2.0


def test_pause_past_the_ttl_then_resume_fences(cellactors_fleet: Callable[..., Fleet]) -> None:
    fleet = cellactors_fleet([Counter], nodes=2)
    assert fleet.call(Counter, "a", "increment", "x", via=0) == 1
    paused = fleet.pause(0)
    assert fleet.call(Counter, "a", "increment", "x", via=1) == 2
    fleet.resume(0)
    assert paused.status == "fenced"
    with pytest.raises(NodeUnavailable):  # a fenced node answers nothing
        paused.call("Counter", "a", "get", {"name": "x"})
    assert fleet.acknowledged(Counter, "a")["counts"] == [{"name": "x", "n": 2}]


def test_drain_hands_cells_on_and_restart(cellactors_fleet: Callable[..., Fleet]) -> None:
    fleet = cellactors_fleet([Counter], nodes=2)
    fleet.call(Counter, "a", "increment", "x", via=0)
    fleet.drain(0)
    assert fleet.owner(Counter, "a") is None  # released
    assert fleet.call(Counter, "a", "increment", "x") == 2  # the first live node is node-1
    assert fleet.owner(Counter, "a") == "node-1"
    again = fleet.restart(0)
    assert again.status == "serving"
    assert fleet.call(Counter, "a", "get", "x", via=0) == 2  # forwarded to the owner


def test_advancing_alarm_time_fires_alarms_an_hour_away(
    cellactors_fleet: Callable[..., Fleet],
) -> None:
    """A hosted cell's alarm and an orphan's (its owner killed) both fire once alarm time
    has moved past them; nothing waits an hour, and no lease expires meanwhile."""
    fleet = cellactors_fleet([Reminder], nodes=2)
    fleet.call(Reminder, "hosted", "remind", delay=3600, via=0)
    fleet.call(Reminder, "orphan", "remind", delay=3600, via=1)
    fleet.kill(1)  # its cell is hosted nowhere now: only a scan finds the alarm
    assert fleet.call(Reminder, "hosted", "fired", via=0) == []
    fleet.advance_alarms(3601)

    def fired_once(name: str) -> bool:
        return len(fleet.call(Reminder, name, "fired", via=0)) == 1

    for name in ("hosted", "orphan"):
        eventually(functools.partial(fired_once, name), timeout=10)
    assert fleet.owner(Reminder, "orphan") == "node-0"
    assert all(n.status == "serving" for n in fleet.nodes if n.node_id == "node-0")


def test_a_cell_calls_a_cell_its_peer_owns(cellactors_fleet: Callable[..., Fleet]) -> None:
    fleet = cellactors_fleet([Hop], nodes=2)
    assert fleet.call(Hop, "y", "relay", path=[], via=1) == ["y"]
    assert fleet.call(Hop, "x", "relay", path=["y"], value="v", via=0) == ["x", "y"]
    assert (fleet.owner(Hop, "x"), fleet.owner(Hop, "y")) == ("node-0", "node-1")
    assert fleet.call(Hop, "y", "seen", via=1) == ["", "v"]
    fleet.kill(1)  # the forward to it runs nowhere; the route is forgotten, y taken over
    assert fleet.call(Hop, "x", "relay", path=["y"], via=0) == ["x", "y"]
    assert fleet.owner(Hop, "y") == "node-0"


def test_dead_letters_through_the_fleet_follow_the_owner(
    cellactors_fleet: Callable[..., Fleet],
) -> None:
    """A typo is a dead letter of its sender; the fleet lists, retries and purges it on
    whichever node owns the sender, also after that owner was killed."""
    fleet = cellactors_fleet(
        [Payer, Account], nodes=2, settings=NodeSettings(outbox_max_attempts=2)
    )
    [typo] = fleet.call(Payer, "p", "pay", to="bob", amounts=[5], method="depositt", via=0)
    [good] = fleet.call(Payer, "p", "pay", to="bob", amounts=[7], via=0)
    eventually(lambda: fleet.call(Account, "bob", "credits") == [7], timeout=10)
    eventually(lambda: len(fleet.dead_letters(Payer, "p")) == 1, timeout=10)
    letters = fleet.dead_letters(Payer, "p")
    assert [(x.id, x.method, x.code) for x in letters] == [(typo, "depositt", "unknown_method")]
    assert good != typo
    fleet.kill(fleet.owner(Payer, "p") or "node-0")
    assert [x.id for x in fleet.dead_letters(Payer, "p")] == [typo]  # restored elsewhere
    assert fleet.retry_dead_letters(Payer, "p") == [typo]  # a typo stays one: given up again
    eventually(lambda: [x.id for x in fleet.dead_letters(Payer, "p")] == [typo], timeout=10)
    assert fleet.purge_dead_letters(Payer, "p") == [typo]
    assert fleet.dead_letters(Payer, "p") == []
    assert fleet.call(Account, "bob", "credits") == [7]
