"""A read of a cell that has never existed, answered without creating it.

A read-only call whose cell has no ownership record in the bucket runs on a scratch
activation: an in-memory database, ``on_activate`` run in it, then the method. The answer is
what the cell's first activation would give, and nothing of it is kept: no ``own.json``, no
batch, no local file. So reads of names nobody wrote cost one bucket request each and leave
the bucket as they found it (a stranger reading made-up names cannot grow it).

It answers from a state no write has reached: were a write to create the cell meanwhile,
the read is simply ordered before it. Every commit of the scratch cell (its
``on_activate``) is acknowledged at once, since there is nothing to make durable.
"""

from __future__ import annotations

from typing import Any

from cellactors.actors.cell import CellActor
from cellactors.actors.cell_runtime import CellRuntime
from cellactors.actors.channel import ReplicaChannel
from cellactors.actors.messages import Invoke
from cellactors.clock import RuntimeClock
from cellactors.core.alarms import wake_keys
from cellactors.persistence.celldb.database import CellDatabase


def _discarding_channel() -> ReplicaChannel:
    """A channel whose every commit is taken and acknowledged as it is made: there is no
    replicator, and nothing to ship."""
    channel = ReplicaChannel(0)

    def acknowledge() -> None:
        txns = channel.take()
        if txns:
            channel.take_effects(txns[-1].txid)
            channel.ack(txns[-1].txid)

    channel.on_commit = acknowledge
    return channel


def read_vacant(
    cls: type[CellActor], cell_id: str, invoke: Invoke, clock: RuntimeClock, timeout: float
) -> tuple[bool, Any]:
    """Run ``invoke`` (a read-only call) on a scratch activation of ``cls``: (True, its
    answer), or its error raised. (False, None) when the cell needs a real activation:
    its ``on_activate`` raised (or needs what only a node gives, such as calling other
    cells), or it set an alarm or sent a message, which only a cell that exists keeps and
    fires. The call then activates the cell for real, which reports such a failure as it
    always does."""
    database = CellDatabase(":memory:")
    runtime = CellRuntime(
        cell_id=cell_id,
        name=cell_id.split(":", 1)[1],
        epoch=0,
        database=database,
        channel=_discarding_channel(),
        next_txid=1,
        clock=clock,
    )
    actor = cls.start_unopened()
    try:
        try:
            state = actor.open_here(runtime)
        except Exception:
            return False, None
        if wake_keys(state):
            return False, None
        # Right here: the scratch cell is idle and open, so it never starts a thread.
        run_inline = runtime.run_inline
        if run_inline is None or not run_inline(invoke):
            return False, None
        return True, invoke.reply.get(timeout=timeout)
    finally:
        actor.actor_ref.stop(block=False)
        database.close()
