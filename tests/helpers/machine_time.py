"""Whether the test machine itself lost time while a test ran.

A virtual machine that is frozen (live migration, a host snapshot) or whose wall clock is
stepped by time synchronisation shows it as the wall clock moving against the monotonic
clock. Every ``cellactors serve`` on that machine sees the same jump, and every one of them
is right to fence itself (a node cannot tell a frozen machine from a paused process), so a
scenario that asserts "no node fenced" is void when it happens. Such a failure is raised
again as :class:`MachineLostTime`, which the suite re-runs (``--only-rerun
MachineLostTime`` in pyproject.toml); any other failure is reported as it is.
"""

from __future__ import annotations

import time
from collections.abc import Generator
from dataclasses import dataclass

import pytest

#: A larger gap than time synchronisation's slewing makes in a test's minutes (at most
#: 0.5 ms/s), smaller than the smallest jump a node of the suite fences on (TTL 2 s / 6).
LOST_TIME_LIMIT_S = 0.25


class MachineLostTime(AssertionError):
    """The test failed while the machine's wall clock jumped against its monotonic clock."""


@dataclass(frozen=True)
class ClockPair:
    """The wall and the monotonic clock read together."""

    wall: float
    mono: float

    @classmethod
    def now(cls) -> ClockPair:
        return cls(wall=time.time(), mono=time.monotonic())

    def drift_since(self, start: ClockPair) -> float:
        """How far the wall clock moved against the monotonic clock since ``start``."""
        return (self.wall - start.wall) - (self.mono - start.mono)


def lost_time(start: ClockPair, end: ClockPair, limit: float = LOST_TIME_LIMIT_S) -> float | None:
    """The jump between ``start`` and ``end`` if it is over ``limit``, else None."""
    drift = end.drift_since(start)
    return drift if abs(drift) > limit else None


_STARTED = pytest.StashKey[ClockPair]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    """Note the clocks before a test's fixtures start (a setup failure is judged too)."""
    item.stash[_STARTED] = ClockPair.now()
    return (yield from _blaming_lost_time(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    """A test that fails while the machine lost time is re-raised as MachineLostTime."""
    return (yield from _blaming_lost_time(item))


def _blaming_lost_time(item: pytest.Item) -> Generator[None, None, None]:
    try:
        return (yield)
    except Exception as err:
        jump = lost_time(item.stash[_STARTED], ClockPair.now())
        if jump is None:
            raise
        raise MachineLostTime(
            f"this machine's wall clock moved {jump:+.3f}s against its monotonic clock during"
            f" the test (a frozen VM or a stepped clock; every node on it sees the same): {err}"
        ) from err
