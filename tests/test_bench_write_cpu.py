"""``python -m bench.write_cpu`` still runs: two nodes from this checkout, a few cells, two
short rounds; every node reports writes and CPU, the second its ratio to the first. Speed is
not checked."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

SMALL = ("--cells", "8", "--clients", "4", "--rounds", "2", "--window", "0.5")

pytestmark = [pytest.mark.fleet, pytest.mark.bench]  # it starts cellactors serve processes


def test_two_trees_are_compared() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench.write_cpu", str(REPO), str(REPO), *SMALL],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [line for line in proc.stdout.splitlines() if " writes/s, node " in line]
    assert [line.split(" ", 1)[0] for line in lines] == ["n0", "n1"], proc.stdout
    for line in lines:
        match = re.search(r": (\d+) writes/s, node ([0-9.]+) ms CPU", line)
        assert match is not None, line
        assert int(match.group(1)) > 0 and float(match.group(2)) > 0, line
    assert "the first tree's" in lines[1] and "the first tree's" not in lines[0]
