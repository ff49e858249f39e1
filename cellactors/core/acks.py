"""The acknowledgement gate: which held responses may be released (docs/protocol.md, "Writes and
the acknowledgement rule").

Every response of a cell waits until every transaction committed before it is acknowledged.
Responses are queued in the order the cell produced them, which is txid order, so releasing
is a prefix of the queue. Once failed, the gate releases nothing ever again.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

W = TypeVar("W")


@dataclass
class _Held(Generic[W]):
    needs: int  # highest txid that must be acknowledged first
    waiter: W


class AckGate(Generic[W]):
    """Pure bookkeeping; the owner serialises access (a lock in the replicator)."""

    def __init__(self, acked: int = 0) -> None:
        self.committed = acked
        self.acked = acked
        self.failed: BaseException | None = None
        self._held: deque[_Held[W]] = deque()

    def commit(self, txid: int) -> None:
        """Record a newly committed transaction; txids are strictly increasing."""
        if txid <= self.committed:
            raise ValueError(f"txid {txid} after {self.committed}")
        self.committed = txid

    def hold(self, waiter: W) -> list[W]:
        """Queue a response behind everything committed so far; returns what may go now."""
        if self.failed is not None:
            raise self.failed
        self._held.append(_Held(self.committed, waiter))
        return self._release()

    def ack(self, upto: int) -> list[W]:
        """Transactions through ``upto`` are proven durable; returns releasable responses."""
        if self.failed is not None:
            return []
        self.acked = max(self.acked, min(upto, self.committed))
        return self._release()

    def fail(self, error: BaseException) -> list[W]:
        """Nothing more is released; returns every held response (to fail them)."""
        if self.failed is None:
            self.failed = error
        out = [h.waiter for h in self._held]
        self._held.clear()
        return out

    @property
    def unacked(self) -> int:
        return self.committed - self.acked

    def _release(self) -> list[W]:
        out: list[W] = []
        while self._held and self._held[0].needs <= self.acked:
            out.append(self._held.popleft().waiter)
        return out


def settle(waiters: list[W], action: Callable[[W], None]) -> None:
    """Apply ``action`` to every waiter in order (release or fail)."""
    for waiter in waiters:
        action(waiter)
