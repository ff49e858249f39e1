"""A rollback in place, on the cell's thread (the executor's ``RollBack``).

The user's tables become what they were right after ``to_txid``
(:func:`cellactors.persistence.celldb.rollback.restore_user_state`), and ``on_activate``
runs after that, in one transaction, which the history marks as a rollback (``to_txid`` and
the txid before it, to undo it): the change feed shows it, and a restore replays it like any
other transaction. A point at or after the cell's latest txid is refused, and nothing
changes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from cellactors.actors.cell_runtime import user_failure
from cellactors.actors.messages import RollBack, RolledBack
from cellactors.errors import ActivationFailed, BadRequest, NodeStorageFault
from cellactors.persistence.celldb.capture import TxnChanges
from cellactors.persistence.celldb.database import image_source
from cellactors.persistence.celldb.rollback import restore_user_state

if TYPE_CHECKING:
    from cellactors.actors.cell_runtime import CellRuntime
    from cellactors.actors.channel import Outcome


class Rolling(Protocol):
    """What a rollback needs of the cell's executor
    (:class:`~cellactors.actors.executor.CellExecutor`)."""

    cell: Any

    def _run(self, fn: Callable[[], Any]) -> tuple[Any, TxnChanges]: ...

    def _commit(
        self, changes: TxnChanges, outcome: Outcome, rollback: tuple[int, int] | None = None
    ) -> None: ...

    def storage_fault_of(self, err: BaseException) -> NodeStorageFault | None: ...


def roll_back(executor: Rolling, rt: CellRuntime, msg: RollBack, outcome: Outcome) -> None:
    """Run the rollback ``msg`` asks for; its answer (or error) goes into ``outcome``: a
    refusal before the transaction is ``not_run``, a transaction that raised (``on_activate``
    or the restore of the tables) was rolled back: ``failed``."""
    latest = rt.next_txid - 1
    if msg.to_txid is None:
        outcome.value = (rt.incarnation, rt.epoch, latest)  # held until ``latest`` is durable
        return
    cell_id = executor.cell.cell_id
    if msg.incarnation != rt.incarnation:
        outcome.error = ActivationFailed(
            f"{cell_id} moved, or was purged, while it was being rolled back: nothing changed; "
            "try again"
        )
        return
    if msg.to_txid >= latest:
        outcome.error = BadRequest(
            f"{cell_id} is at txid {latest}: a rollback goes to an earlier one"
        )
        return
    try:
        with image_source(msg.image) as past:

            def body() -> None:
                restore_user_state(rt.database.conn, past)
                # As an activation does: the tables the running code creates there exist
                # again, even after a rollback to before they were created; it runs for no
                # caller, as at an activation.
                executor.cell._chain = (cell_id,)
                executor.cell._caller = None
                executor.cell.on_activate()

            _, changes = executor._run(body)
    except Exception as err:
        fault = executor.storage_fault_of(err)
        outcome.error = fault or user_failure(err, f"the rollback of {cell_id}")
        return
    txid = None if changes.empty else rt.next_txid
    outcome.value = RolledBack(msg.to_txid, txid, latest)
    executor._commit(changes, outcome, (msg.to_txid, latest))
