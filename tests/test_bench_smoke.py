"""The benchmark suite still runs: ``python -m bench --quick`` at minimal sizes reports every
row. Speed is not checked (benchmarks assert nothing about it); breakage is."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.common import Sizes
from bench.suite import row_ids

REPO = Path(__file__).resolve().parent.parent
SCALE = 0.1

pytestmark = [pytest.mark.fleet, pytest.mark.bench]  # it starts cellactors serve processes


def test_quick_suite_reports_every_row(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--scale", str(SCALE), "--json", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,  # about 75 s on a quiet machine; under load, twice that
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(out.read_text())
    assert report["errors"] == []
    rows = {row["id"]: row for row in report["rows"]}
    assert list(rows) == row_ids(Sizes.quick().scaled(SCALE))
    for row in rows.values():
        assert row["runs"], row["id"]
        assert isinstance(row["metric"], (int, float)), row["id"]
        assert isinstance(row["met"], bool), row["id"]
    assert "| 10-failover |" in proc.stdout  # the table is printed
    # The request counts behind row 2 are read from the node (in process) and from a
    # served node's /metrics: every batch PUT is followed by an own.json GET (a snapshot's
    # collection may add one), so a count that reads nothing shows here.
    for row_id in ("2-inproc", "2-http"):
        for run in rows[row_id]["runs"]:
            assert 1.0 <= run["own_gets_per_put"] < 1.5, (row_id, run)
