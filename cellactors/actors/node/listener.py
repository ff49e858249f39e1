"""How a node's alarm driver and outbox hear of its cells opening and leaving: the
activation catalogue's listener."""

from __future__ import annotations

from typing import Any, Protocol

from cellactors.actors.alarms import AlarmDriver, CellSink
from cellactors.actors.node.pushes import PushDriver
from cellactors.actors.outbox import OutboxWorkers
from cellactors.actors.ownership import Active
from cellactors.actors.replicator import EffectSink


class ActivationListener(Protocol):
    """Told when a cell opens here or leaves (the node's alarm driver and outbox)."""

    def opened(self, active: Active) -> None:
        """A cell opened here, before its first call: a failure fails the activation."""

    def released(self, cell_id: str) -> None:
        """A cell is hosted nowhere here any more (or is about to be)."""

    def sink(self, cell_id: str, epoch: int) -> EffectSink:
        """Where the replicator of the cell's activation at ``epoch`` reports acked effects."""
        ...


class _Sink:
    """One activation's hooks: its wake entries (the alarm driver) and its pushes."""

    def __init__(self, alarms: CellSink, pushes: PushDriver, cell_id: str, epoch: int):
        self.alarms = alarms
        self.pushes = pushes
        self.cell_id = cell_id
        self.epoch = epoch

    def before_upload(self, effects: list[Any]) -> None:
        self.alarms.before_upload(effects)

    def after_ack(self, effects: list[Any]) -> None:
        self.alarms.after_ack(effects)

    def pushed(self, pushes: list[Any]) -> None:
        self.pushes.pushed(self.cell_id, self.epoch, pushes)


class CellEvents:
    """Tells the alarm driver, the outbox and the push driver what the catalogue does with
    cells."""

    def __init__(self, alarms: AlarmDriver, outbox: OutboxWorkers, pushes: PushDriver) -> None:
        self.alarms = alarms
        self.outbox = outbox
        self.pushes = pushes

    def opened(self, active: Active) -> None:
        """A cell opened here: mirror its wake entries, schedule its alarm, wake its
        outbox. Before its first call: a failure fails the activation."""
        cell_id = active.runtime.cell_id
        state = active.wakes
        self.alarms.activated(
            cell_id, active.epoch, state, resumed=active.restored_from == "hibernated"
        )
        if state.outbox:
            self.outbox.kick(cell_id)

    def released(self, cell_id: str) -> None:
        """A cell left this node (or is leaving): its alarms are the bucket's again, and
        its next owner does not know which pushes were sent."""
        self.alarms.released(cell_id)
        self.pushes.released(cell_id)

    def sink(self, cell_id: str, epoch: int) -> EffectSink:
        """Where the cell's replicator reports what its acknowledged transactions changed."""
        return _Sink(self.alarms.sink(cell_id, epoch), self.pushes, cell_id, epoch)
