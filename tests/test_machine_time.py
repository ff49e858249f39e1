"""The suite re-runs a test only when it failed while the machine itself lost time."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.machine_time import ClockPair, lost_time

pytest_plugins = ["pytester"]

INNER = """
import itertools, time

RUNS = itertools.count(1)

def test_jumped(monkeypatch):
    if next(RUNS) == 1:  # the first run sees the wall clock jump 5 s ahead, then fails
        real = time.time
        monkeypatch.setattr(time, "time", lambda: real() + 5.0)
        raise AssertionError("node fenced itself")

def test_plain_failure():
    raise AssertionError("a real bug")
"""


def test_lost_time_is_the_wall_clock_moving_against_the_monotonic_one() -> None:
    start = ClockPair(wall=1000.0, mono=50.0)
    assert lost_time(start, ClockPair(wall=1010.0, mono=60.1)) is None  # slewing, not a jump
    assert lost_time(start, ClockPair(wall=1018.0, mono=60.0)) == pytest.approx(8.0)
    assert lost_time(start, ClockPair(wall=1002.0, mono=60.0)) == pytest.approx(-8.0)


def test_only_a_failure_during_lost_time_is_run_again(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parents[1]))
    pytester.makepyfile(INNER)
    result = pytester.runpytest_subprocess(
        "-p", "tests.helpers.machine_time", "--reruns", "2", "--only-rerun", "MachineLostTime"
    )
    assert result.parseoutcomes() == {"passed": 1, "failed": 1, "rerun": 1}
    result.stdout.fnmatch_lines(["*AssertionError: a real bug"])
