"""What the first call to a never-used cell costs, and how much of it the store alone costs.

``python -m bench.first_call_floor`` starts the embedded store and one ``cellactors serve``
node on it (the example counter), then alternates, in blocks, two ways of doing a new
cell's first write:

- **cellactors**: ``POST /cells/Counter/<new name>/increment`` on one keep-alive
  connection (the node activates the cell, creates its database, writes and acknowledges);
- **store only**: the store requests that first call makes, sent by boto3 (configured like
  the node's client) to a new cell's keys under another prefix, one after another: the
  conditional create of ``own.json`` (``If-None-Match: *``), the batch PUT, and the re-read
  of ``own.json``, preceded by the GET of ``own.json`` that answers 404 (the node reads the
  record before it claims the cell);
- **no first GET**: the same without that GET, as a node that tried the conditional create
  first would do for a new cell.

Per way: p50 latency, and CPU milliseconds per first call of the node and of the store from
``/proc``. The store-only figures are the floor a first call cannot go below with this
store on this machine, whatever the node does.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import botocore.exceptions
import httpx

from bench.common import (
    ACCESS_KEY,
    BENCH_KEYS,
    BUCKET,
    SECRET_KEY,
    BareS3,
    CpuMeter,
    percentile,
    store_environment,
)
from bench.procs import NodeProc
from cellactors.core import keys
from cellactors.persistence.store.embedded import SeaweedServer
from cellactors.persistence.store.s3 import S3Bucket

BODY = b'{"name": "x"}'
HEADERS = {"content-type": "application/json"}
#: An ``own.json`` and a first batch of about the sizes the node writes for a counter.
OWN = b'{"node":"n1","epoch":1,"acked_txid":0,"addr":"127.0.0.1:8081","generation":"g"}'
BATCH = b"b" * 900


def store_only(s3: Any, prefix: str, cell_id: str, read_first: bool = True) -> None:
    """The store requests of a new cell's first call, in the node's order (without the first
    GET of ``own.json`` unless ``read_first``); ``s3``: a boto3 client, as the baseline's."""
    own = f"{prefix}/{keys.owner_key(cell_id)}"
    if read_first:
        try:
            s3.get_object(Bucket=BUCKET, Key=own)["Body"].read()
            raise RuntimeError(f"{own} exists")
        except botocore.exceptions.ClientError as err:
            if err.response["Error"]["Code"] not in ("NoSuchKey", "404"):
                raise
    s3.put_object(Bucket=BUCKET, Key=own, Body=OWN, IfNoneMatch="*")
    batch = f"{prefix}/{keys.batch_key(cell_id, 1, 1, 2)}"
    s3.put_object(Bucket=BUCKET, Key=batch, Body=BATCH)
    s3.get_object(Bucket=BUCKET, Key=own)["Body"].read()


def _alternate(
    url: str, s3: Any, pids: dict[str, int | str], args: argparse.Namespace
) -> tuple[dict[str, list[float]], dict[str, dict[str, list[float]]]]:
    """The two ways in blocks, alternating which goes first: latencies, and CPU per call of
    each process per block."""
    lat: dict[str, list[float]] = {"cellactors": [], "store only": [], "no first GET": []}
    cpu: dict[str, dict[str, list[float]]] = {way: {"node": [], "store": []} for way in lat}
    seq = 0
    with httpx.Client(base_url=url, timeout=30) as http:
        http.post("/cells/Counter/warm/increment", content=BODY, headers=HEADERS)
        for r in range(args.rounds):
            ways = list(lat)
            for way in ways if r % 2 == 0 else reversed(ways):
                with CpuMeter(pids) as meter:
                    for _ in range(args.block):
                        seq += 1
                        t = time.perf_counter()
                        if way == "cellactors":
                            path = f"/cells/Counter/new-{seq}/increment"
                            http.post(path, content=BODY, headers=HEADERS).raise_for_status()
                        else:
                            first = way == "store only"
                            store_only(s3, "floor", f"Counter:new-{seq}", read_first=first)
                        lat[way].append(time.perf_counter() - t)
                figures = meter.figures(args.block)
                for proc in ("node", "store"):
                    cpu[way][proc].append(figures[f"cpu_ms_{proc}"])
    return lat, cpu


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.first_call_floor")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--block", type=int, default=20, help="first calls per way and round")
    args = parser.parse_args(argv)
    store_environment()
    with (
        tempfile.TemporaryDirectory(prefix="cellactors-first-") as tmp,
        SeaweedServer(Path(tmp) / "store", credentials=BENCH_KEYS) as store,
    ):
        S3Bucket(
            BUCKET, "", endpoint=store.endpoint, access_key=ACCESS_KEY, secret_key=SECRET_KEY
        ).ensure_exists()
        node = NodeProc("n1", Path(tmp) / "node", f"s3://{BUCKET}/first", store.endpoint)
        node.start()
        try:
            node.ready()
            assert store.proc is not None
            pids: dict[str, int | str] = {"node": node.pid, "store": store.proc.pid}
            lat, cpu = _alternate(node.url, BareS3(store.endpoint).client, pids, args)
        finally:
            node.stop()
    print(f"{'way':<12} {'p50 ms':>8} {'p90 ms':>8} {'node CPU ms':>12} {'store CPU ms':>13}")
    for way, samples in lat.items():
        print(
            f"{way:<12} {1000 * percentile(samples, 0.5):8.2f}"
            f" {1000 * percentile(samples, 0.9):8.2f}"
            f" {statistics.median(cpu[way]['node']):12.2f}"
            f" {statistics.median(cpu[way]['store']):13.2f}"
        )
    ratio = percentile(lat["cellactors"], 0.5) / percentile(lat["store only"], 0.5)
    print(f"cellactors / store only, p50: {ratio:.2f}x")


if __name__ == "__main__":
    main(sys.argv[1:])
