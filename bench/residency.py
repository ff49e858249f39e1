"""Row 5 in a fresh interpreter (so no other row's memory is reused or counted): start a node,
activate ``--warm`` cells (thread pools and caches reach their size), measure RSS, threads
and fds, activate ``--cells`` more, let them go idle, measure again; then hibernate them
all, measure again, and wake a sample of them one at a time (latency and bucket requests);
print one JSON line.

``python -m bench.residency --endpoint URL --prefix P --cells N``
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import gc
import json
import statistics
import time
from pathlib import Path

from bench.common import ACCESS_KEY, BUCKET, SECRET_KEY, proc_status, run_parallel
from cellactors import Node, NodeSettings
from cellactors.actors.node import TRIM_AFTER_S
from cellactors.persistence.store.s3 import S3Bucket
from examples.counter import Counter


def settle() -> dict[str, int]:
    """Process figures after a short pause, a full collection, and glibc handing freed heap
    back to the system (what it would do on its own, later, under memory pressure)."""
    time.sleep(0.5)
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass  # not glibc: RSS keeps freed memory, the figure is an upper bound
    return proc_status()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--data-dir", required=True, type=Path)
    parser.add_argument("--cells", type=int, default=800)
    parser.add_argument("--warm", type=int, default=40)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument(
        "--dormant-factor",
        type=int,
        default=4,
        help="cells activated and hibernated in batches, as a multiple of --cells",
    )
    args = parser.parse_args()
    bucket = S3Bucket(
        BUCKET, args.prefix, endpoint=args.endpoint, access_key=ACCESS_KEY, secret_key=SECRET_KEY
    )
    settings = NodeSettings(advertise="127.0.0.1:9", data_dir=args.data_dir)
    node = Node(bucket, "resident", [Counter], settings).start()

    def activate(name: str) -> None:
        # One write: the activation and its first batch (a read of a cell nobody created
        # would activate nothing).
        node.cell(Counter, name).increment("x")

    try:
        run_parallel([functools.partial(activate, f"warm-{i}") for i in range(args.warm)], 16)
        before = settle()
        elapsed = run_parallel(
            [functools.partial(activate, f"idle-{i}") for i in range(args.cells)],
            args.concurrency,
        )
        # Idle long enough for the node to trim every cell's caches (it checks each second).
        time.sleep(TRIM_AFTER_S + 1.5)
        after = settle()
        resident = node.resident_cells()
        for i in range(args.cells):
            node.hibernate(f"Counter:idle-{i}")
        hibernated_first = settle()
        # Then cells that come and go, as on a node with hibernation on: activated a batch
        # at a time and hibernated right away, so memory freed by one batch serves the next.
        batch = 50
        dormant = args.cells * args.dormant_factor
        for start in range(0, dormant, batch):
            names = [f"dormant-{i}" for i in range(start, min(dormant, start + batch))]
            run_parallel([functools.partial(activate, name) for name in names], args.concurrency)
            for name in names:
                node.hibernate(f"Counter:{name}")
        hibernated = settle()
        hibernated_count = node.hibernated_cells()
        sample = [f"idle-{i}" for i in range(0, args.cells, max(1, args.cells // 200))]
        requests_before = _not_lease(node)
        wakes = []
        for name in sample:
            started = time.perf_counter()
            node.cell(Counter, name).get("x")
            wakes.append(time.perf_counter() - started)
        wake_requests = _not_lease(node) - requests_before
    finally:
        node.stop()
    n = args.cells
    dormant_rss = max(1.0, (hibernated["rss"] - hibernated_first["rss"]) / dormant)
    rss = (after["rss"] - before["rss"]) / n
    print(
        json.dumps(
            {
                "cells": n,
                "resident": resident,
                "rss_per_cell_kib": rss / 1024,
                "cells_per_2gib": (2 << 30) / rss if rss > 0 else float("inf"),
                "threads_per_cell": (after["threads"] - before["threads"]) / n,
                "fds_per_cell": (after["fds"] - before["fds"]) / n,
                "rss_before_mib": before["rss"] / (1 << 20),
                "rss_after_mib": after["rss"] / (1 << 20),
                "new_cell_activations_per_s": n / elapsed,
                "hibernated": hibernated_count,
                "hibernated_rss_per_cell_kib": dormant_rss / 1024,
                "hibernated_per_gib": (1 << 30) / dormant_rss,
                "hibernated_threads_per_cell": (hibernated["threads"] - before["threads"])
                / hibernated_count,
                "hibernated_fds_per_cell": (hibernated["fds"] - before["fds"]) / hibernated_count,
                "rss_after_hibernating_mib": hibernated_first["rss"] / (1 << 20),
                "wakes": len(wakes),
                "wake_p50_ms": statistics.median(wakes) * 1000,
                "wake_requests": wake_requests,
            }
        )
    )


def _not_lease(node: Node) -> int:
    """The node's bucket requests so far, lease renewals aside (they run on their own
    schedule and may fall inside any window)."""
    return sum(n for (_op, kind), n in node.bucket.snapshot().items() if kind != "lease")


if __name__ == "__main__":
    main()
