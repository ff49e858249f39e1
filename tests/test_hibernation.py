"""Hibernation: an idle cell keeps its ownership and its file but holds no thread,
connection or file descriptor, and the next call wakes it with no bucket request."""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest

from cellactors import Node
from cellactors.actors.node import collector as collector_module
from cellactors.actors.ownership import Active
from cellactors.persistence.control.ownership import OwnershipStore
from cellactors.persistence.store.s3 import S3Bucket
from tests.helpers.buckets import CuttableBucket, delta
from tests.helpers.cells import Counter
from tests.helpers.runtime import (
    active_of,
    cell_dump,
    crash,
    dormant_of,
    eventually,
    host_of,
    make_node,
)

CELL = "Counter:a"


def owner(bucket: S3Bucket, cell_id: str = CELL) -> tuple[str, int]:
    """(node, epoch) of ``own.json``, read past the node's metered bucket."""
    record = OwnershipStore(bucket, "reader").read_owner(cell_id)
    assert record is not None
    return record.node, record.epoch


def open_cell_files(node_dir: Path) -> list[str]:
    """Files below ``node_dir`` this process holds open."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except FileNotFoundError:
            continue
        if target.startswith(str(node_dir)):
            found.append(target)
    return found


def test_a_hibernated_cell_holds_nothing_and_wakes_with_no_request(sw_bucket: S3Bucket) -> None:
    node = make_node(sw_bucket, "n1")
    try:
        cell = node.cell(Counter, "a")
        assert cell.increment("x") == 1
        threads = threading.active_count()
        assert open_cell_files(node.cells_dir) != []
        host = host_of(node, CELL)
        active, ownership = host.active, host.ownership
        assert active is not None and ownership is not None
        assert node.hibernate(CELL)
        assert node.resident_cells() == 0 and node.hibernated_cells() == 1
        assert open_cell_files(node.cells_dir) == []
        # The cell actor (and its thread), its replicator and its ownership actor are gone
        # (the last two hold a thread only while they work).
        eventually(lambda: threading.active_count() <= threads - 1, timeout=10)
        eventually(lambda: not (active.cell.is_alive() or active.replicator.is_alive()), timeout=10)
        eventually(lambda: not ownership.is_alive(), timeout=10)
        assert owner(sw_bucket) == ("n1", 1)  # still owned: nothing was written
        before = node.bucket.snapshot()
        assert cell.get("x") == 1
        assert delta(node, before) == {}  # woken with no bucket request
        assert node.state()["cells"][0]["restored_from"] == "hibernated"
        assert node.hibernated_cells() == 0
        before = node.bucket.snapshot()
        assert cell.increment("x") == 2
        assert delta(node, before) == {("put", "batch"): 1, ("get", "own"): 1}
        assert owner(sw_bucket) == ("n1", 1)
    finally:
        node.stop()


def test_idle_cells_hibernate_then_are_released(sw_bucket: S3Bucket) -> None:
    node = make_node(sw_bucket, "n1", hibernate_timeout=0.2, idle_timeout=1.5)
    try:
        assert node.cell(Counter, "a").increment("x") == 1
        eventually(lambda: node.hibernated_cells() == 1, timeout=10)
        assert owner(sw_bucket) == ("n1", 1)
        eventually(lambda: owner(sw_bucket) == ("", 1), timeout=10)  # released after 1.5 s
        assert node.hibernated_cells() == 0
        # The released file is reused by the next activation, which claims epoch 2.
        assert node.cell(Counter, "a").increment("x") == 2
        # Counted, not read from state(): the cell may hibernate again right away.
        assert 'cellactors_activations_total{class="Counter",source="local"} 1.0' in (
            node.metrics_text()
        )
        assert owner(sw_bucket) == ("n1", 2)
    finally:
        node.stop()


def test_drain_releases_hibernated_cells(sw_bucket: S3Bucket) -> None:
    a = make_node(sw_bucket, "na")
    b = make_node(sw_bucket, "nb")
    try:
        for name in ("h1", "h2", "h3"):
            a.cell(Counter, name).increment("x")
            assert a.hibernate(f"Counter:{name}")
        assert a.hibernated_cells() == 3
        a.drain()
        for name in ("h1", "h2", "h3"):
            assert owner(sw_bucket, f"Counter:{name}") == ("", 1)
            assert b.cell(Counter, name).increment("x") == 2
    finally:
        a.stop()
        b.stop()


def test_a_crashed_node_s_hibernated_cells_are_taken_over_whole(sw_bucket: S3Bucket) -> None:
    a = make_node(sw_bucket, "na")
    b = make_node(sw_bucket, "nb")
    try:
        cell = a.cell(Counter, "a")
        for _ in range(3):
            cell.increment("x")
        original = cell_dump(a, CELL)
        assert a.hibernate(CELL)
        crash(a, sw_bucket)
        assert a.hibernated_cells() == 0  # a fenced node forgets them
        assert eventually(lambda: b.cell(Counter, "a").get("x")) == 3
        assert cell_dump(b, CELL) == original
        assert owner(sw_bucket) == ("nb", 2)
    finally:
        a.stop()
        b.stop()


def test_a_changed_file_is_not_resumed(sw_bucket: S3Bucket) -> None:
    node = make_node(sw_bucket, "n1")
    try:
        cell = node.cell(Counter, "a")
        cell.increment("x")
        assert node.hibernate(CELL)
        dormant = dormant_of(node, CELL)
        with open(dormant.copy.path, "ab") as fh:
            fh.write(b"\0" * 4096)  # anything may have happened to it: not provably current
        assert cell.increment("x") == 2  # restored from the bucket at the next epoch
        assert node.state()["cells"][0]["restored_from"] == "bucket"
        assert owner(sw_bucket) == ("n1", 2)
    finally:
        node.stop()


def test_hibernation_is_off_when_it_would_not_come_before_release(sw_bucket: S3Bucket) -> None:
    node = make_node(sw_bucket, "n1", hibernate_timeout=5.0, idle_timeout=0.3)
    try:
        node.cell(Counter, "a").increment("x")
        eventually(lambda: owner(sw_bucket) == ("", 1), timeout=10)
        assert node.hibernated_cells() == 0
    finally:
        node.stop()


def test_a_store_error_releasing_a_hibernated_cell_keeps_nothing_unproven(
    sw_bucket: S3Bucket,
) -> None:
    """The release of a hibernated cell fails (store cut): its file is dropped, not kept as
    a reusable copy, and own.json still names the node; the next call claims the next epoch
    and restores from the bucket, every acknowledged write included."""
    cut = CuttableBucket(sw_bucket)
    node = make_node(cut, "n1")
    try:
        cell = node.cell(Counter, "a")
        for _ in range(3):
            cell.increment("x")
        assert node.hibernate(CELL)
        path = dormant_of(node, CELL).copy.path
        cut.cut = True
        node.activations.release_dormant(CELL)
        cut.cut = False
        assert node.hibernated_cells() == 0 and node.activations.local_copy(CELL) is None
        assert not path.exists()
        assert owner(sw_bucket) == ("n1", 1)  # nothing was written
        assert cell.increment("x") == 4
        assert node.state()["cells"][0]["restored_from"] == "bucket"
        assert owner(sw_bucket) == ("n1", 2)
    finally:
        node.stop()


def written_cell(node: Node) -> tuple[Any, Active]:
    """Counter ``a`` on ``node``, written once (so it is active there), and its activation."""
    cell = node.cell(Counter, "a")
    assert cell.increment("x") == 1
    active = active_of(node, CELL)
    assert active is not None
    return cell, active


def test_an_idle_resident_cell_trims_its_caches_once_per_idle_period(
    sw_bucket: S3Bucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(collector_module, "TRIM_AFTER_S", 0.1)
    node = make_node(sw_bucket, "n1", hibernate_timeout=10, idle_timeout=60)
    try:
        cell, active = written_cell(node)
        runtime = active.runtime
        eventually(lambda: runtime.database.trims == 1, timeout=5)
        assert runtime.trimmed_for == runtime.last_used  # this idle period is done
        assert cell.get("x") == 1  # a trimmed cell reads its file again
        assert cell.increment("x") == 2
        eventually(lambda: runtime.database.trims >= 2, timeout=5)  # a new idle period
        assert node.resident_cells() == 1 and node.hibernated_cells() == 0
    finally:
        node.stop()


def test_a_failing_trim_leaves_the_reaper_hibernating_cells(
    sw_bucket: S3Bucket, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # The trim runs in the node's reaper: a cell whose trim fails must not stop the reaper.
    caplog.set_level(logging.ERROR, logger="cellactors.actors.cell")
    monkeypatch.setattr(collector_module, "TRIM_AFTER_S", 0.1)
    node = make_node(sw_bucket, "n1", hibernate_timeout=1.5, idle_timeout=60)
    try:
        cell, active = written_cell(node)
        tried: list[int] = []

        def failing_trim() -> None:
            tried.append(1)
            raise sqlite3.OperationalError("disk I/O error (test)")

        active.runtime.database.trim = failing_trim  # type: ignore[method-assign]
        eventually(lambda: bool(tried) and active.runtime.trimmed_for == active.runtime.last_used)
        assert "trimming the caches of Counter:a failed" in caplog.text
        eventually(lambda: node.hibernated_cells() == 1, timeout=10)  # the reaper goes on
        assert len(tried) == 1  # once per idle period, failed or not
        assert cell.get("x") == 1
    finally:
        node.stop()
