"""Benchmark: write and read latency of one cell, and what group commit buys.

Starts an embedded SeaweedFS on loopback, runs one node in process, and prints numbers and
ratios (not assertions). Usage: python bench/bench_runtime.py [--writes 200]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cellactors import Node, NodeSettings
from cellactors.persistence.embedded import SeaweedServer
from cellactors.persistence.s3 import S3Bucket
from examples.counter import Counter


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--writes", type=int, default=200)
    parser.add_argument("--threads", type=int, default=16)
    args = parser.parse_args()
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    with tempfile.TemporaryDirectory() as tmp, SeaweedServer(Path(tmp) / "store") as store:
        bucket = S3Bucket("bench", "", endpoint=store.endpoint)
        bucket.ensure_exists()
        node = Node(bucket, "bench", [Counter], NodeSettings(advertise="127.0.0.1:1")).start()
        cell = node.cell(Counter, "a")
        cell.increment("warm")

        lat = []
        for _ in range(args.writes):
            t = time.perf_counter()
            cell.increment("x")
            lat.append(time.perf_counter() - t)
        seq_rate = args.writes / sum(lat)

        reads = []
        for _ in range(args.writes):
            t = time.perf_counter()
            cell.get("x")
            reads.append(time.perf_counter() - t)

        before = node.bucket.snapshot()[("put", "batch")]
        per_thread = args.writes // args.threads

        def writer() -> None:
            for _ in range(per_thread):
                cell.increment("y")

        threads = [threading.Thread(target=writer) for _ in range(args.threads)]
        t = time.perf_counter()
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        elapsed = time.perf_counter() - t
        puts = node.bucket.snapshot()[("put", "batch")] - before
        conc_rate = per_thread * args.threads / elapsed
        node.stop()

    ms = 1000
    print(
        f"sequential writes: p50 {statistics.median(lat) * ms:.2f} ms, "
        f"p99 {sorted(lat)[int(len(lat) * 0.99) - 1] * ms:.2f} ms, {seq_rate:.0f}/s"
    )
    print(f"reads (active cell, 0 bucket requests): p50 {statistics.median(reads) * ms:.3f} ms")
    print(
        f"concurrent writes ({args.threads} threads): {conc_rate:.0f}/s, "
        f"{per_thread * args.threads} writes in {puts} batch PUTs "
        f"({per_thread * args.threads / max(puts, 1):.1f} writes per PUT)"
    )
    print(f"group commit speed-up: {conc_rate / seq_rate:.1f}x")


if __name__ == "__main__":
    main()
