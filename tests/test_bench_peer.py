"""``python -m bench --peer restate`` skips, with its reason and exit code 0, when the peer
cannot be installed; nothing is downloaded (the cache is unwritable, or npm is missing)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.common import Sizes
from bench.peer_restate import table
from bench.peer_restate_install import PeerUnavailable, install
from bench.peer_workloads import PeerSizes

REPO = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.bench]


def _run_bench(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bench", "--peer", "restate", "--quick", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture
def unwritable(tmp_path: Path) -> Path:
    """A cache directory that cannot be made: under a read-only directory, or (as root,
    which ignores mode bits) under a regular file."""
    if os.geteuid() == 0:
        blocker = tmp_path / "cache"
        blocker.write_text("not a directory")
        return blocker
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(stat.S_IRUSR | stat.S_IXUSR)
    return locked / "cache"


def test_unwritable_cache_skips_with_reason(unwritable: Path) -> None:
    proc = _run_bench(["--peer-cache", str(unwritable)], dict(os.environ))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "SKIPPED --peer restate" in proc.stdout
    assert "not writable" in proc.stdout
    assert "| workload |" not in proc.stdout  # nothing was measured


def test_missing_npm_skips_with_reason(tmp_path: Path) -> None:
    """An empty cache and no npm on PATH (the cache variable names where to install)."""
    env = {
        **os.environ,
        "PATH": str(tmp_path / "empty-bin"),
        "CELLACTORS_BENCH_CACHE": str(tmp_path),
    }
    proc = _run_bench([], env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "SKIPPED --peer restate: npm is not on PATH" in proc.stdout
    assert not (tmp_path / "restate" / "node_modules").exists()


def test_install_raises_peer_unavailable_without_npm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    with pytest.raises(PeerUnavailable, match="npm is not on PATH"):
        install(tmp_path)


def test_table_gives_medians_and_ratios_cellactors_over_restate() -> None:
    def side(p50: list[float], rate: float, rss: dict[str, float]) -> dict[str, Any]:
        return {
            "lone": [{"p50_ms": v} for v in p50],
            "hot": [{"acks_per_s": rate}],
            "spread": [{"acks_per_s": rate, "cpu_ms_per_ack": 2.0}],
            "first": [{"p50_ms": 10.0, "cpu_ms_per_call": 4.0}],
            "rss": [rss],
        }

    ours = side([9.0, 2.0, 6.0], 300.0, {"rss_kib_node": 10.0, "rss_kib_store": 20.0})
    theirs = side([4.0, 3.0, 5.0], 100.0, {"rss_kib_server": -1.0, "rss_kib_service": 0.0})
    runs = {w: {"cellactors": ours[w], "Restate": theirs[w]} for w in ours}
    lines = table(runs, PeerSizes.of(Sizes()))
    assert lines[0] == ["1. one key, sequential: p50 latency", "6.00 ms", "4.00 ms", "1.50x"]
    assert lines[1] == ["2. one key, 64 clients: acks/s", "300", "100", "3.00x"]
    assert lines[2][0] == "3. 256 keys, 64 clients: acks/s"
    assert lines[-1][1] == "30.0 KiB (node 10.0, store 20.0)"
    assert lines[-1][3] == "-"  # no ratio to a growth within the noise (not above zero)
