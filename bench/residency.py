"""Row 5 in a fresh interpreter (so no other row's memory is reused or counted): start a node,
activate ``--warm`` cells (thread pools and caches reach their size), measure RSS, threads
and fds, activate ``--cells`` more, let them go idle, measure again; print one JSON line.

``python -m bench.residency --endpoint URL --prefix P --cells N``
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import time
from pathlib import Path

from bench.common import ACCESS_KEY, BUCKET, SECRET_KEY, proc_status, run_parallel
from cellactors import Node, NodeSettings
from cellactors.persistence.s3 import S3Bucket
from examples.counter import Counter


def settle() -> dict[str, int]:
    """Process figures after a short pause and a full collection."""
    time.sleep(0.5)
    gc.collect()
    return proc_status()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--data-dir", required=True, type=Path)
    parser.add_argument("--cells", type=int, default=800)
    parser.add_argument("--warm", type=int, default=40)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    bucket = S3Bucket(
        BUCKET, args.prefix, endpoint=args.endpoint, access_key=ACCESS_KEY, secret_key=SECRET_KEY
    )
    settings = NodeSettings(advertise="127.0.0.1:9", data_dir=args.data_dir)
    node = Node(bucket, "resident", [Counter], settings).start()

    def activate(name: str) -> None:
        node.cell(Counter, name).get("x")  # a read: activation (on_activate) and nothing else

    try:
        run_parallel([functools.partial(activate, f"warm-{i}") for i in range(args.warm)], 16)
        before = settle()
        elapsed = run_parallel(
            [functools.partial(activate, f"idle-{i}") for i in range(args.cells)],
            args.concurrency,
        )
        after = settle()
        resident = node.resident_cells()
    finally:
        node.stop()
    n = args.cells
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
            }
        )
    )


if __name__ == "__main__":
    main()
