"""Pure decisions of alarms, wake entries, calls between cells and the outbox.

Nothing here does I/O or imports from the other layers: the actors ask these functions and
perform what they answer (docs/writing-a-cell.md, "Alarms", "Calls between cells",
"The outbox").

- :func:`retry_at`: when a failed ``on_alarm`` runs again, or that it is abandoned.
- :class:`Schedule`: the timer heap of the alarms of a node's resident cells.
- :func:`scan_action`: what a node does with one due wake entry found by its scan.
- :func:`wake_keys` / :func:`wake_changes`: the wake entries a cell's durable state needs,
  and which to write before an answer is released and which to delete after.
- :func:`cycle_in`: whether a call between cells would wait on a cell already waiting.
- :func:`deliverable`: which outbox messages a delivery round sends, in per-target order.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import Enum

#: The nonce of the outbox wake entry: constant, so the entry exists once per cell while
#: its outbox holds messages, at time 0 (always due).
OUTBOX_TAG = "outbox"
#: Longest call chain (cells waiting on one another) a call between cells may extend.
MAX_CHAIN = 32


@dataclass(frozen=True)
class AlarmPolicy:
    """Retries of a failing ``on_alarm``: after failure ``n`` (1, 2, ...) it runs again
    ``backoff_s * 2**(n-1)`` seconds later (at most ``backoff_max_s``); after
    ``max_failures`` failures in a row the alarm is abandoned."""

    max_failures: int = 6
    backoff_s: float = 2.0
    backoff_max_s: float = 300.0

    def __post_init__(self) -> None:
        if self.max_failures < 1:
            raise ValueError(f"max_failures must be at least 1, not {self.max_failures}")
        if not (self.backoff_s > 0 and self.backoff_max_s >= self.backoff_s):
            raise ValueError("backoff_s must be positive and at most backoff_max_s")


def retry_at(policy: AlarmPolicy, failures: int, now_ms: int) -> int | None:
    """When an alarm that has now failed ``failures`` times in a row runs again (epoch
    milliseconds), or None: abandoned."""
    if failures >= policy.max_failures:
        return None
    delay = min(policy.backoff_max_s, policy.backoff_s * 2 ** (failures - 1))
    return now_ms + int(delay * 1000)


def to_ms(at: float | int | datetime) -> int:
    """An alarm time (epoch seconds, or an aware/naive-local datetime) in epoch ms."""
    if isinstance(at, datetime):
        return int(at.timestamp() * 1000)
    if isinstance(at, bool) or not isinstance(at, (int, float)):
        raise TypeError(f"an alarm time is epoch seconds or a datetime, not {type(at).__name__}")
    if at != at or at < 0 or at > 1e13:  # NaN, negative, or beyond year 318857
        raise ValueError(f"invalid alarm time {at!r}")
    return int(at * 1000)


@dataclass(frozen=True, order=True)
class Wake:
    """One wake entry of a cell: due at ``at_ms``, told apart by ``nonce`` (an alarm's own
    random nonce, or :data:`OUTBOX_TAG`). A nonce never repeats, so a late delete of an
    old entry can never remove a newer one at the same time."""

    at_ms: int
    nonce: str


@dataclass(frozen=True)
class WakeState:
    """What a cell's durable state needs mirrored: its alarm (if any) and whether its
    outbox holds messages."""

    alarm: Wake | None = None
    outbox: bool = False


def wake_keys(state: WakeState) -> frozenset[Wake]:
    """The wake entries that must exist for ``state``."""
    wakes = set()
    if state.alarm is not None:
        wakes.add(state.alarm)
    if state.outbox:
        wakes.add(Wake(0, OUTBOX_TAG))
    return frozenset(wakes)


def wake_changes(
    mirrored: frozenset[Wake], state: WakeState
) -> tuple[frozenset[Wake], frozenset[Wake]]:
    """(entries to write before the answers are released, entries to delete after the
    acknowledgement): a new entry exists before anyone is told, an old one goes only once
    the transaction that made it unnecessary is durable."""
    wanted = wake_keys(state)
    return wanted - mirrored, mirrored - wanted


class Action(Enum):
    """What to do with one due wake entry (see :func:`scan_action`)."""

    STOP = "stop"  # not due: the listing is in time order, nothing after it is due either
    LOCAL = "local"  # hosted here and current: the timer heap (or the outbox) has it
    DROP = "drop"  # hosted here and not current: a stale entry, deleted after a check
    SKIP = "skip"  # another live node owns it (a cached route), or the class is not served
    ACTIVATE = "activate"  # activate it here through the ownership path


def scan_action(
    wake: Wake,
    now_ms: int,
    hosted: frozenset[Wake] | None,
    routed_elsewhere: bool,
    served: bool,
) -> Action:
    """The decision for one entry of a scan. ``hosted`` is the mirrored set of entries of
    the cell when this node hosts it (active or hibernated), else None."""
    if wake.at_ms > now_ms:
        return Action.STOP
    if hosted is not None:
        return Action.LOCAL if wake in hosted else Action.DROP
    if routed_elsewhere or not served:
        return Action.SKIP
    return Action.ACTIVATE


class Schedule:
    """The alarms of one node's resident cells, in due order. At most one alarm per cell:
    setting a cell again replaces its alarm (stale heap items are skipped lazily)."""

    def __init__(self) -> None:
        self._current: dict[str, Wake] = {}
        self._heap: list[tuple[int, str, str]] = []

    def set(self, cell_id: str, alarm: Wake | None, at_ms: int | None = None) -> None:
        """Make ``alarm`` the cell's alarm (None: none), due at ``at_ms`` if given (a
        retry of a fire that could not run) else at its own time."""
        if alarm is None:
            self._current.pop(cell_id, None)
            return
        self._current[cell_id] = alarm
        heapq.heappush(self._heap, (alarm.at_ms if at_ms is None else at_ms, cell_id, alarm.nonce))

    def get(self, cell_id: str) -> Wake | None:
        return self._current.get(cell_id)

    def pop_due(self, now_ms: int) -> list[tuple[str, Wake]]:
        """Every current alarm due by ``now_ms``, removed from the heap (the caller sets it
        again if the fire must be retried)."""
        out: list[tuple[str, Wake]] = []
        while self._heap and self._heap[0][0] <= now_ms:
            _, cell_id, nonce = heapq.heappop(self._heap)
            alarm = self._current.get(cell_id)
            if alarm is not None and alarm.nonce == nonce and (cell_id, alarm) not in out:
                out.append((cell_id, alarm))
        return out

    def next_at(self) -> int | None:
        """When the next item is due (it may be stale: waking early is harmless)."""
        while self._heap:
            at, cell_id, nonce = self._heap[0]
            alarm = self._current.get(cell_id)
            if alarm is not None and alarm.nonce == nonce:
                return at
            heapq.heappop(self._heap)
        return None

    def __len__(self) -> int:
        return len(self._current)


def cycle_in(chain: Sequence[str], target: str) -> bool:
    """Whether a call to ``target`` from the last cell of ``chain`` would wait on a cell
    that is itself waiting (``target`` is in the chain: A -> B -> A, or A -> A)."""
    return target in chain


@dataclass(frozen=True)
class Pending:
    """One outbox message as a delivery round sees it."""

    seq: int
    target: str  # cell id
    txid: int


def deliverable(rows: Iterable[Pending], acked_txid: int, blocked: set[str]) -> list[Pending]:
    """The messages to send now, in ``seq`` order: committed in an acknowledged transaction,
    and not behind an earlier undelivered message to the same target (``blocked`` holds
    the targets whose earlier message failed in this round; it is extended in place as
    the round meets more)."""
    out = []
    for row in sorted(rows, key=lambda r: r.seq):
        if row.txid > acked_txid:
            blocked.add(row.target)  # later ones to the same target must wait for it
            continue
        if row.target in blocked:
            continue
        out.append(row)
    return out


def delivery_backoff(round_failures: int, base_s: float = 0.2, cap_s: float = 10.0) -> float:
    """Seconds to wait before the next delivery round after ``round_failures`` rounds in a
    row that left messages undelivered."""
    return float(min(cap_s, base_s * 2 ** max(0, round_failures - 1)))
