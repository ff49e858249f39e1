"""A really full disk under a real ``cellactors serve``: its data directory is a small tmpfs
in a mount namespace of its own (it goes away with the process). Writes that need space are
answered 503 ``storage_unavailable`` (``not_run``) and the Python client retries them; a
second node serves the cells meanwhile; once space returns the first node takes cells again.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from cellactors.client import Client
from cellactors.persistence.control.leases import LeaseStore
from cellactors.persistence.store.embedded import SeaweedServer
from cellactors.persistence.store.s3 import S3Bucket
from tests.helpers.fleet import NODE_HEADER, Fleet, NodeProc, ledger_entries, wait_for, write_app
from tests.helpers.metrics import parse, value
from tests.helpers.stores import make_s3_bucket

pytestmark = pytest.mark.fleet

#: The data directory's size: room for the node's cells, filled up by the test.
TMPFS_SIZE = "2m"
#: An entry that needs pages the cell's file does not have yet.
BIG = "x" * 65536
#: Runs ``$3...`` with a tmpfs of size ``$1`` on ``$2``, in a mount namespace of its own.
UNSHARE = ["unshare", "-m", "--propagation", "private", "sh", "-c"]
UNSHARE += ['mount -t tmpfs -o size="$1" tmpfs "$2" && shift 2 && exec "$@"', "sh"]


def mount_problem() -> str | None:
    """None when this machine can mount a tmpfs in a private mount namespace, else why not."""
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        return "unshare(1) or mount(8) is missing"
    with tempfile.TemporaryDirectory() as folder:
        tried = subprocess.run(
            [*UNSHARE, "1m", folder, "true"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    if tried.returncode != 0:
        return f"cannot mount a tmpfs in a private mount namespace: {tried.stderr.strip()}"
    return None


@dataclass
class TmpfsNode(NodeProc):
    """A ``cellactors serve`` whose ``--data-dir`` is a tmpfs of ``size``, mounted in a
    mount namespace of its own: nobody else sees it, and it is gone when the process is."""

    size: str = TMPFS_SIZE

    def args(self) -> list[str]:
        data = self.workdir / "data"
        data.mkdir(parents=True, exist_ok=True)
        return [*UNSHARE, self.size, str(data), *super().args()]

    def data_dir(self) -> Path:
        """The tmpfs, reached through the process's own view of the file system."""
        assert self.proc is not None
        return Path(f"/proc/{self.proc.pid}/root") / str(self.workdir / "data").lstrip("/")


def fill(folder: Path) -> Path:
    """Write a file into ``folder`` until the file system has no byte left."""
    filler = folder / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for chunk in (1 << 20, 1 << 16, 1 << 12, 1 << 9, 1):
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, bytes(chunk))
    finally:
        os.close(fd)
    with pytest.raises(OSError) as info:
        probe = os.open(folder / "room?", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            os.write(probe, bytes(4096))
        finally:
            os.close(probe)
    assert info.value.errno == errno.ENOSPC
    (folder / "room?").unlink(missing_ok=True)
    return filler


def append(url: str, cell: str, entry: str) -> httpx.Response:
    return httpx.post(f"{url}/cells/Ledger/{cell}/append", json={"entry": entry}, timeout=30)


def metric(node: NodeProc, name: str) -> float:
    answer = httpx.get(node.internal_url + "/metrics", timeout=5)
    return value(parse(answer.text), name)


def lease_storage(bucket: S3Bucket, node: NodeProc) -> str | None:
    snap = LeaseStore(bucket, "reader").read_lease(node.node_id)
    return None if snap is None else str(snap.lease.load.get("storage"))


@pytest.fixture
def disk_fleet(tmp_path: Path, seaweed: SeaweedServer) -> Iterator[tuple[Fleet, S3Bucket]]:
    """A node on a small tmpfs and a healthy peer, on a fresh bucket; killed at teardown."""
    problem = mount_problem()
    if problem is not None:
        pytest.skip(problem)
    bucket = make_s3_bucket(seaweed.endpoint)
    app = write_app(tmp_path)
    spec = f"s3://{bucket.bucket}"
    full = TmpfsNode("disk-a", app, tmp_path / "a", spec, seaweed.endpoint)
    peer = NodeProc("disk-b", app, tmp_path / "b", spec, seaweed.endpoint)
    fleet = Fleet([full, peer])
    try:
        fleet.start()
        yield fleet, bucket
    finally:
        fleet.stop()


def test_a_full_disk_is_answered_not_run_and_the_fleet_serves_on(
    disk_fleet: tuple[Fleet, S3Bucket],
) -> None:
    fleet, bucket = disk_fleet
    full, peer = fleet[0], fleet[1]
    assert isinstance(full, TmpfsNode)
    for cell in ("c1", "c2"):
        assert append(full.public_url, cell, f"{cell}-first").json()["result"] == 1
        assert fleet.owner(f"Ledger:{cell}")[0] is full
    cells = full.data_dir() / full.node_id / "cells"
    assert sorted(p.name for p in cells.iterdir()) == ["Ledger:c1.e1.db", "Ledger:c2.e1.db"]

    filler = fill(full.data_dir())
    answer = append(full.public_url, "c1", BIG)
    assert answer.status_code == 503, answer.text
    body = answer.json()
    assert (body["error"], body["outcome"], body["retryable"]) == (
        "storage_unavailable",
        "not_run",
        True,
    )
    assert "SQLITE_FULL" in body["message"], body  # what the max_page_count tests fake
    assert answer.headers["Retry-After"] == "1"
    assert answer.headers[NODE_HEADER] == full.node_id

    # The Python client retries it: the first attempt fails on the full node, the retry
    # finds the cell given up and placed on the healthy peer.
    with Client([full.public_url]) as client:
        assert client.cell("Ledger", "c2").append(entry=BIG) == 2
        assert client.cell("Ledger", "c1").append(entry="c1-second") == 2
        assert client.cell("Ledger", "c3").append(entry="c3-first") == 1  # a new cell
    assert metric(full, "cellactors_storage_faults_total") == 2  # one per cell
    for cell in ("c1", "c2", "c3"):
        assert fleet.owner(f"Ledger:{cell}")[0] is peer
    assert ledger_entries(fleet.urls, "c1") == ["c1-first", "c1-second"]  # BIG never landed
    assert ledger_entries(fleet.urls, "c2") == ["c2-first", BIG]
    assert full.state()["storage"] == "degraded"
    assert metric(full, "cellactors_storage_degraded") == 1
    wait_for("the degraded lease", lambda: lease_storage(bucket, full) == "degraded", 10)
    assert list(cells.iterdir()) == []  # the given-up cells' files are gone

    # Space returns: the next probe passes, and the node takes cells again by itself.
    filler.unlink()
    wait_for("recovery", lambda: full.state()["storage"] == "ok", 15)
    wait_for("the healthy lease", lambda: lease_storage(bucket, full) == "ok", 10)
    assert metric(full, "cellactors_storage_degraded") == 0
    assert append(full.public_url, "c4", "c4-first").json()["result"] == 1
    assert fleet.owner("Ledger:c4")[0] is full
    assert append(full.public_url, "c4", BIG).json()["result"] == 2  # it writes again
    answer = append(full.public_url, "c1", "c1-third")  # forwarded to its owner
    assert answer.json()["result"] == 3 and answer.headers[NODE_HEADER] == peer.node_id

    log = full.output()
    assert log.count("local storage is failing") == 1, log[-3000:]
    assert log.count("local storage recovered") == 1, log[-3000:]
