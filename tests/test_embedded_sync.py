"""The embedded store syncs each object before it answers its PUT: strace, attached to the
real ``weed mini``, records every sync call while PUTs (and a node's acknowledged writes)
run one after another; each answer must come after a sync of the volume's data file and
one of the filer's metadata store (docs/stores.md, "The embedded store")."""

from __future__ import annotations

import os
import queue
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import boto3
import pytest

from cellactors.persistence.store.embedded import SeaweedServer
from cellactors.persistence.store.s3 import S3Bucket
from tests.helpers.cells import Counter
from tests.helpers.runtime import make_node
from tests.helpers.stores import env_keys

STRACE = shutil.which("strace")
SYNC_CALLS = "fsync,fdatasync,sync_file_range,msync,syncfs"
WRITES = 25

# "<tid> <secs.usecs> fsync(7</path>) = 0 <0.000321>", or the same call split in two:
# "... fsync(7</path> <unfinished ...>" then "<tid> <secs> <... fsync resumed>) = 0 <...>".
_WHOLE = re.compile(r"^(\d+)\s+([\d.]+) (\w+)\(\d+<([^>]*)>.*\) = (-?\d+).* <([\d.]+)>$")
_UNFINISHED = re.compile(r"^(\d+)\s+([\d.]+) (\w+)\(\d+<([^>]*)>.*<unfinished \.\.\.>$")
_RESUMED = re.compile(r"^(\d+)\s+([\d.]+) <\.\.\. (\w+) resumed>.*\) = (-?\d+).* <([\d.]+)>$")


@dataclass(frozen=True)
class Sync:
    """One successful sync call: its file and when it ran (wall clock, seconds)."""

    path: str
    start: float
    end: float


def parse_syncs(text: str) -> list[Sync]:
    """The successful sync calls in strace's ``-f -y -ttt -T`` output."""
    syncs: list[Sync] = []
    pending: dict[str, tuple[str, float]] = {}
    for line in text.splitlines():
        if m := _WHOLE.match(line):
            if m[5] == "0":
                start = float(m[2])
                syncs.append(Sync(m[4], start, start + float(m[6])))
        elif m := _UNFINISHED.match(line):
            pending[m[1]] = (m[4], float(m[2]))
        elif (m := _RESUMED.match(line)) and m[1] in pending:
            path, start = pending.pop(m[1])
            if m[4] == "0":
                syncs.append(Sync(path, start, float(m[2])))
    return syncs


def test_parse_syncs_reads_whole_split_and_failed_calls() -> None:
    text = (
        "11 100.000000 fsync(7</d/c_1.dat>) = 0 <0.000500>\n"
        "12 100.100000 fdatasync(8</d/filer.db-wal> <unfinished ...>\n"
        "13 100.150000 fsync(9</d/x>) = -1 EIO (Input/output error) <0.000100>\n"
        "12 100.200000 <... fdatasync resumed>) = 0 <0.100000>\n"
    )
    assert parse_syncs(text) == [
        Sync("/d/c_1.dat", 100.0, 100.0005),
        Sync("/d/filer.db-wal", 100.1, 100.2),
    ]


class TraceRefused(Exception):
    """strace could not attach (it said why)."""


def _untraceable(tmp_path: Path) -> str | None:
    """Why strace cannot attach to a process here (as the tests do), or None."""
    if STRACE is None:
        return "strace is not installed (.ci/run installs it)"
    target = subprocess.Popen(["cat"], stdin=subprocess.PIPE)
    try:
        with SyncTrace(target.pid, tmp_path / "probe.txt"):
            pass
    except TraceRefused as err:
        return f"strace cannot attach to a process here (ptrace refused): {err}"
    finally:
        target.kill()
        target.wait()
    return None


class SyncTrace:
    """strace attached to every thread of a running process, recording its sync calls."""

    def __init__(self, pid: int, out: Path) -> None:
        self.pid, self.out = pid, out
        self.proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> SyncTrace:
        assert STRACE is not None
        args = [STRACE, "-f", "-y", "-ttt", "-T", "-e", f"trace={SYNC_CALLS}", "-o", str(self.out)]
        self.proc = subprocess.Popen(
            [*args, "-p", str(self.pid)], stderr=subprocess.PIPE, text=True
        )
        said: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._relay, args=(said,), daemon=True).start()
        deadline, lines = time.monotonic() + 20, list[str]()
        while True:  # strace says so once it has attached to the process and its threads
            line = said.get(timeout=max(0.01, deadline - time.monotonic()))
            if line is None:  # it ended without attaching
                self.proc.wait(timeout=20)
                raise TraceRefused("".join(lines).strip()[-300:])
            if f"Process {self.pid} attached" in line:
                return self
            lines.append(line)

    def _relay(self, said: queue.Queue[str | None]) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for line in self.proc.stderr:
            said.put(line)
        said.put(None)

    def __exit__(self, *exc: object) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGINT)  # detaches and flushes its output
        self.proc.wait(timeout=20)

    def syncs(self) -> list[Sync]:
        return parse_syncs(self.out.read_text())


@pytest.fixture
def traced_store(tmp_path: Path) -> Iterator[tuple[SeaweedServer, Path]]:
    reason = _untraceable(tmp_path)
    if reason:
        pytest.skip(reason)
    server = SeaweedServer(tmp_path / "store", credentials=env_keys()).start()
    try:
        yield server, tmp_path / "strace.txt"
    finally:
        server.stop(grace=0)


def _timed(n: int, op: Callable[[int], object]) -> list[tuple[float, float]]:
    """Run ``op(i)`` ``n`` times in turn; when each was sent and answered (wall clock)."""
    spans = []
    for i in range(n):
        sent = time.time()
        op(i)
        spans.append((sent, time.time()))
    return spans


def _unsynced(
    spans: list[tuple[float, float]], syncs: list[Sync], store: Path
) -> list[tuple[int, str]]:
    """(index, what) for each answer not preceded, since its request was sent, by a
    completed sync of a volume data file and one of the filer's SQLite store."""
    kinds: dict[str, Callable[[str], bool]] = {
        "volume data (.dat)": lambda p: p.startswith(str(store)) and p.endswith(".dat"),
        "filer store (filer.db*)": lambda p: Path(p).name.startswith("filer.db"),
    }
    missing: list[tuple[int, str]] = []
    for i, (sent, answered) in enumerate(spans):
        for kind, matches in kinds.items():
            if not any(matches(s.path) and sent <= s.start and s.end <= answered for s in syncs):
                missing.append((i, kind))
    return missing


@pytest.mark.slow  # a store of its own, traced
def test_every_put_is_answered_after_its_data_and_its_entry_are_synced(
    traced_store: tuple[SeaweedServer, Path],
) -> None:
    server, out = traced_store
    assert server.proc is not None
    s3 = boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1")
    s3.create_bucket(Bucket="synced")
    s3.put_object(Bucket="synced", Key="first", Body=b"x")  # the bucket's volumes exist
    with SyncTrace(server.proc.pid, out) as trace:
        spans = _timed(
            WRITES, lambda i: s3.put_object(Bucket="synced", Key=f"k{i}", Body=os.urandom(900))
        )
    syncs = trace.syncs()
    assert len(syncs) >= WRITES, f"{len(syncs)} sync calls for {WRITES} PUTs"
    assert _unsynced(spans, syncs, server.data_dir) == []


@pytest.mark.slow
def test_every_acknowledged_write_of_a_node_is_synced_before_its_answer(
    traced_store: tuple[SeaweedServer, Path], tmp_path: Path
) -> None:
    server, out = traced_store
    assert server.proc is not None
    boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1").create_bucket(
        Bucket="cells"
    )
    node = make_node(S3Bucket("cells", endpoint=server.endpoint), "n1", data_dir=tmp_path / "n")
    try:
        cell = node.cell(Counter, "a")
        cell.increment("x")  # activated; its first batch made the volumes
        with SyncTrace(server.proc.pid, out) as trace:
            spans = _timed(WRITES, lambda i: cell.increment("x"))
    finally:
        node.stop()
    syncs = trace.syncs()
    assert len(syncs) >= WRITES, f"{len(syncs)} sync calls for {WRITES} acknowledged writes"
    assert _unsynced(spans, syncs, server.data_dir) == []
