"""``python -m bench.first_call_floor`` still runs: a node and its store, two short rounds
of first calls each way; every way reports a latency and the store's CPU. Speed is not
checked."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.fleet, pytest.mark.bench]  # it starts a cellactors serve process


def test_every_way_is_reported() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench.first_call_floor", "--rounds", "2", "--block", "3"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = {}
    for line in proc.stdout.splitlines():
        match = re.match(r"(cellactors|store only|no first GET)\s+([0-9.]+)\s+([0-9.]+)", line)
        if match:
            rows[match.group(1)] = float(match.group(2))
    assert set(rows) == {"cellactors", "store only", "no first GET"}, proc.stdout
    assert all(p50 > 0 for p50 in rows.values()), proc.stdout
    assert re.search(r"cellactors / store only, p50: [0-9.]+x", proc.stdout), proc.stdout
