"""``cellactors.testing.Fleet(store="seaweedfs")``: works with no AWS configuration at all,
and never leaves a ``weed`` process behind, whatever fails while it starts."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from cellactors.persistence.store.embedded import SeaweedServer
from cellactors.persistence.store.s3 import S3Bucket
from cellactors.testing import Fleet
from tests.helpers.cells import Counter


def weed_processes(under: Path) -> list[int]:
    """The pids of ``weed`` processes whose command line names a folder under ``under``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            words = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # gone meanwhile
        if words and words[0].endswith(b"weed") and str(under).encode() in b" ".join(words):
            found.append(int(entry.name))
    return found


def no_weed_left(under: Path, timeout: float = 15.0) -> bool:
    """Whether every ``weed`` under ``under`` is gone (polled until ``timeout``)."""
    deadline = time.monotonic() + timeout
    while weed_processes(under):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.fixture
def no_aws(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """An environment whose AWS credential chain finds nothing."""
    for name in [n for n in os.environ if n.startswith("AWS_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.mark.usefixtures("no_aws")
def test_a_seaweedfs_fleet_needs_no_aws_configuration(tmp_path: Path) -> None:
    with Fleet([Counter], 2, store="seaweedfs", data_dir=tmp_path) as fleet:
        assert fleet.cell(Counter, "a").increment("x") == 1
        assert fleet.cell(Counter, "a", via=1).increment("x") == 2
        assert weed_processes(tmp_path)
    assert no_weed_left(tmp_path)


def test_a_failing_bucket_creation_stops_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(self: S3Bucket) -> None:
        raise RuntimeError("test: the bucket cannot be created")

    monkeypatch.setattr(S3Bucket, "ensure_exists", refuse)
    with pytest.raises(RuntimeError, match="cannot be created"):
        Fleet([Counter], 1, store="seaweedfs", data_dir=tmp_path)
    assert no_weed_left(tmp_path)


def test_a_start_interrupted_once_weed_runs_leaves_no_weed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[int] = []
    start_once = SeaweedServer._start_once

    def interrupted(self: SeaweedServer, timeout: float) -> None:
        start_once(self, timeout)
        assert self.proc is not None and self.proc.poll() is None  # weed is running now
        started.append(self.proc.pid)
        raise KeyboardInterrupt  # Ctrl-C while the store starts: not even an Exception

    monkeypatch.setattr(SeaweedServer, "_start_once", interrupted)
    with pytest.raises(KeyboardInterrupt):  # the server alone stops its process
        SeaweedServer(tmp_path / "alone").start()
    assert no_weed_left(tmp_path / "alone")
    with pytest.raises(KeyboardInterrupt):
        Fleet([Counter], 1, store="seaweedfs", data_dir=tmp_path / "fleet")
    assert len(started) == 2
    assert no_weed_left(tmp_path)
