"""The shared tail of one cell's change feed on one node, pure: which transactions the
followers' one poller has read, and what each follower should do next.

Every follower of a cell that is caught up shares one bucket read per poll interval
(docs/feed.md: cost). The tail keeps the last ``keep`` transactions it read, so a follower
a little behind is served from memory; one further behind (below what the tail keeps)
pages through history with reads of its own, then joins. No I/O and no clock here: the
server (:mod:`cellactors.server.feed`) performs the reads and passes the time in.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from cellactors.core.changes import Change


class Next(enum.Enum):
    """What a follower at some position does next."""

    TAKE = "take"  # the tail holds transactions after it: take them, no read
    WAIT = "wait"  # it is at (or past) the tail: wait for the shared poller's next round
    OWN = "own"  # behind what the tail keeps: read the bucket on its own


@dataclass
class FeedTail:
    """The txid the shared poller has read up to (``last``) and its last ``keep``
    transactions; ``due`` is the monotonic time of its next round."""

    last: int
    keep: int
    recent: deque[Change] = field(default_factory=deque)
    due: float = 0.0
    rounds: int = 0

    @classmethod
    def starting(cls, after: int, changes: Sequence[Change], keep: int, due: float) -> FeedTail:
        """A tail seeded with a follower's first page (``changes`` after ``after``)."""
        tail = cls(after, keep, due=due)
        tail.extend(changes)
        return tail

    def next_for(self, pos: int) -> Next:
        """The follower at txid ``pos`` takes, waits or reads on its own."""
        if pos >= self.last:
            return Next.WAIT
        if self.recent and self.recent[0].txid <= pos + 1:
            return Next.TAKE
        return Next.OWN

    def after(self, pos: int) -> list[Change]:
        """The kept transactions after ``pos``, in txid order."""
        return [c for c in self.recent if c.txid > pos]

    def extend(self, changes: Sequence[Change]) -> None:
        """Append what a round read after ``last`` (contiguous txids), dropping the oldest
        beyond ``keep``."""
        for change in changes:
            if change.txid != self.last + 1:
                raise ValueError(f"txid {change.txid} does not follow the tail at {self.last}")
            self.recent.append(change)
            self.last = change.txid
        while len(self.recent) > self.keep:
            self.recent.popleft()

    def advanced(self, changes: Sequence[Change], full: bool, now: float, interval: float) -> None:
        """Record one round read at ``now``: the next is due at once when the page was full
        (more is waiting), else one poll interval later."""
        self.extend(changes)
        self.rounds += 1
        self.due = now if full else now + interval
