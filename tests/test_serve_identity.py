"""Two ``cellactors serve`` processes that want the same thing, as real processes: a node
id a live process holds (refused as soon as the holder renews its lease), a node id a
crashed process held (taken once its lease runs out, said once, with how long), and a data
directory another ``serve`` holds (refused, naming its pid)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cellactors.cli.failures import EXIT_CONFIG
from cellactors.persistence.store.embedded import SeaweedServer
from cellactors.persistence.store.s3 import S3Bucket
from tests.helpers.fleet import COUNTER_APP, NodeProc

WAITING = "waiting for it to expire"


@pytest.fixture
def procs() -> Iterator[list[NodeProc]]:
    started: list[NodeProc] = []
    yield started
    for proc in started:
        proc.kill()


def _node(
    procs: list[NodeProc], where: Path, sw_bucket: S3Bucket, seaweed: SeaweedServer
) -> NodeProc:
    proc = NodeProc("twin", COUNTER_APP, where, f"s3://{sw_bucket.bucket}", seaweed.endpoint)
    procs.append(proc)
    return proc


def test_a_node_id_a_live_process_holds_is_refused_at_its_first_renewal(
    tmp_path: Path, sw_bucket: S3Bucket, seaweed: SeaweedServer, procs: list[NodeProc]
) -> None:
    first = _node(procs, tmp_path / "a", sw_bucket, seaweed).start().ready(60)
    second = _node(procs, tmp_path / "b", sw_bucket, seaweed).start()
    started = time.monotonic()
    code = second.wait(60)
    took = time.monotonic() - started
    assert code == EXIT_CONFIG, second.output()
    last = second.output().strip().splitlines()[-1]
    assert last.startswith("error: node id twin is in use: the process holding it"), last
    assert "stop it first, or start this one with another --node" in last
    # It gave up at the holder's first renewal (every TTL/3 of 2 s), not at its lease's end
    # nor minutes later; the bound leaves room for a loaded machine's interpreter start.
    assert took < 30, took
    assert second.output().count(WAITING) == 1
    assert first.running


def test_a_crashed_holder_is_waited_for_once_then_replaced(
    tmp_path: Path, sw_bucket: S3Bucket, seaweed: SeaweedServer, procs: list[NodeProc]
) -> None:
    crashed = _node(procs, tmp_path / "a", sw_bucket, seaweed)
    crashed.lease_ttl = 8.0  # long enough to outlast the next interpreter's start
    crashed.start().ready(60)
    crashed.kill()  # SIGKILL: its lease stays in the bucket until it runs out
    again = _node(procs, tmp_path / "b", sw_bucket, seaweed).start().ready(60)
    waits = [line for line in again.output().splitlines() if WAITING in line]
    assert len(waits) == 1, again.output()  # said once, not once a second
    assert re.search(r"runs until \d{4}-\d\d-\d\d \S+, in \d+\.\ds: waiting", waits[0])


def test_a_data_dir_another_serve_holds_is_refused_naming_its_pid(
    tmp_path: Path, sw_bucket: S3Bucket, seaweed: SeaweedServer, procs: list[NodeProc]
) -> None:
    first = _node(procs, tmp_path, sw_bucket, seaweed).start().ready(60)
    second = NodeProc("other", COUNTER_APP, tmp_path, f"s3://{sw_bucket.bucket}", seaweed.endpoint)
    procs.append(second)
    second.start()
    assert second.wait(60) == EXIT_CONFIG, second.output()
    assert first.proc is not None
    last = second.output().strip().splitlines()[-1]
    assert last == (
        f"error: --data-dir {tmp_path / 'data'} is in use by another cellactors serve "
        f"(pid {first.proc.pid}); stop that one, or give this one its own --data-dir"
    )
    assert first.running
