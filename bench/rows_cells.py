"""Rows 5-8: resident idle cells, activations per second, cold restore of a long chain, and
whether a snapshot bounds the next restore."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter as Tally
from collections.abc import Callable

from bench.common import BUCKET, REPO, BareS3, CpuMeter, Env, Goal, Row, make_row, run_parallel
from cellactors import Node
from cellactors.persistence.history import restore
from examples.counter import Counter

# The restore's parallel fetches; the bare baseline of row 7 uses as many threads.
FETCH_WORKERS = int(getattr(restore, "FETCH_WORKERS", 8))


def _gets(node: Node) -> Tally[tuple[str, str]]:
    return node.bucket.snapshot()


def _delta(after: Tally[tuple[str, str]], before: Tally[tuple[str, str]]) -> Tally[str]:
    """Requests between two snapshots, by ``op:kind``."""
    out: Tally[str] = Tally()
    for key, count in after.items():
        if count - before.get(key, 0):
            out[f"{key[0]}:{key[1]}"] = count - before.get(key, 0)
    return out


def _per(requests: Tally[str], n: int) -> str:
    """``"get:own 1.0, put_cas:own 1.0, ..."``: requests by kind, per ``n``."""
    return ", ".join(f"{kind} {count / n:g}" for kind, count in sorted(requests.items()))


# --------------------------------------------------------------------------- row 5


def row5(env: Env) -> list[Row]:
    """Resident idle cells per 2 GiB of RSS, measured in a fresh interpreter per run."""
    runs = []
    for run in range(env.sizes.runs):
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "bench.residency",
                "--endpoint",
                env.endpoint,
                "--prefix",
                f"resident-{run}",
                "--data-dir",
                str(env.workdir / f"resident-{run}"),
                "--cells",
                str(env.sizes.resident_cells),
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        if out.returncode != 0:
            raise RuntimeError(f"bench.residency failed: {out.stderr[-3000:]}")
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return [
        make_row(
            "5-resident",
            f"resident idle cells per 2 GiB RSS ({env.sizes.resident_cells} activated)",
            runs,
            metric="cells_per_2gib",
            metric_fmt="{:,.0f}",
            goal=Goal(">=", 10_000, ">= 10,000"),
            figure="{rss_per_cell_kib:.0f} KiB, {threads_per_cell:.1f} threads, "
            "{fds_per_cell:.1f} fds per cell",
        ),
        make_row(
            "5-hibernated",
            f"hibernated cells per GiB RSS ({env.sizes.resident_cells * 4} activated and "
            "hibernated 50 at a time)",
            runs,
            metric="hibernated_per_gib",
            metric_fmt="{:,.0f}",
            goal=Goal(">=", 100_000, ">= 100,000"),
            figure="{hibernated_rss_per_cell_kib:.1f} KiB, {hibernated_threads_per_cell:.2f} "
            "threads, {hibernated_fds_per_cell:.2f} fds per cell",
        ),
        make_row(
            "5-wake",
            "waking a hibernated cell (a read), p50",
            runs,
            metric="wake_p50_ms",
            metric_fmt="{:.2f} ms",
            goal=Goal("<=", 2.0, "<= 2 ms"),
            figure="{wakes:.0f} wakes, {wake_requests:.0f} bucket requests (lease renewals aside)",
        ),
    ]


# --------------------------------------------------------------------------- row 6


def row6(env: Env) -> list[Row]:
    """Activations per second of cells with a little state (one write each, released by
    the node that wrote them); each run activates them all on a fresh node, then releases
    them again."""
    sizes = env.sizes
    n, conc = sizes.activations, sizes.activation_concurrency
    prefix = "activate"
    names = [f"c{i}" for i in range(n)]
    writer = env.node(prefix, "maker")
    try:
        run_parallel([_incrementer(writer, name) for name in names], conc)
    finally:
        writer.stop()  # releases every cell
    runs = []
    for run in range(sizes.runs):
        node = env.node(prefix, f"activator-{run}")
        try:
            before = _gets(node)
            with CpuMeter(env.pids()) as meter:
                elapsed = run_parallel([_reader(node, name) for name in names], conc)
            requests = _delta(_gets(node), before)
        finally:
            node.stop()
        runs.append(
            {
                "activations_per_s": n / elapsed,
                "requests_per_activation": sum(requests.values()) / n,
            }
            | meter.figures(n)
        )
    return [
        make_row(
            "6-activations",
            f"activations per second ({n} cells with one write, {conc} at a time)",
            runs,
            metric="activations_per_s",
            metric_fmt="{:.0f}/s",
            goal=Goal(">=", 200, ">= 200/s"),
            figure="{activations_per_s:.0f}/s, {requests_per_activation:.1f} requests each",
            note="requests per activation in the last run: " + _per(requests, n),
        )
    ]


def _incrementer(node: Node, name: str) -> Callable[[], object]:
    return lambda: node.cell(Counter, name).increment("x")


def _reader(node: Node, name: str) -> Callable[[], object]:
    return lambda: node.cell(Counter, name).get("x")


def _getter(bare: BareS3, key: str) -> Callable[[], object]:
    return lambda: bare.client.get_object(Bucket=BUCKET, Key=key)["Body"].read()


# --------------------------------------------------------------------------- row 7


def row7(env: Env) -> list[Row]:
    """Cold restore of a chain of single-transaction batches: an activation's time on a
    fresh node (snapshots off, so the chain stays whole)."""
    sizes = env.sizes
    prefix, never = "chain", 10**9
    writer = env.node(prefix, "chain-writer", snapshot_every=never)
    try:
        cell = writer.cell(Counter, "long")
        for _ in range(sizes.chain):
            cell.increment("x")  # one at a time: each is its own batch
    finally:
        writer.stop()
    bare = BareS3(env.endpoint, pool=FETCH_WORKERS)
    keys = [f"{prefix}/{i.key}" for i in env.bucket(prefix).list("") if i.key.endswith(".batch")]
    runs = []
    for run in range(sizes.runs):
        with CpuMeter(env.pids()) as meter:
            bare_s = run_parallel([_getter(bare, key) for key in keys], FETCH_WORKERS)
        base_cpu = {f"baseline_{k}": v for k, v in meter.figures(len(keys)).items()}
        node = env.node(prefix, f"restorer-{run}", snapshot_every=never)
        try:
            before = _gets(node)
            with CpuMeter(env.pids()) as meter:
                t = time.perf_counter()
                node.cell(Counter, "long").get("x")
                elapsed = time.perf_counter() - t
            requests = _delta(_gets(node), before)
        finally:
            node.stop()
        runs.append(
            {
                "restore_s": elapsed,
                "batches_read": requests["get:batch"],
                "requests": sum(requests.values()),
                "bare_get_s": bare_s,
            }
            | meter.figures(requests["get:batch"])
            | base_cpu
        )
    return [
        make_row(
            "7-cold-restore",
            f"cold restore of a {sizes.chain}-batch chain (activation + first read)",
            runs,
            metric="restore_s",
            metric_fmt="{:.2f} s",
            goal=Goal("<=", 0.5, "<= 0.5 s"),
            figure="{restore_s:.3f} s, {batches_read:.0f} batches, {requests:.0f} requests",
            note="requests of the last restore: " + _per(requests, 1),
            baseline="bare GET of the batches, "
            + str(FETCH_WORKERS)
            + " threads: {bare_get_s:.3f} s",
        )
    ]


# --------------------------------------------------------------------------- row 8


def row8(env: Env) -> list[Row]:
    """Two activations of ``snapshot_writes`` writes each on two nodes; does a snapshot bound
    the third activation's restore? The snapshot threshold is the default (1000 txids) at
    full size and scales with the writes otherwise."""
    sizes = env.sizes
    writes = sizes.snapshot_writes
    every = max(2, round(writes * 1000 / 600))
    runs = []
    for run in range(sizes.runs):
        prefix = f"snap-{run}"
        for which in ("first", "second"):
            node = env.node(prefix, f"{which}-{run}", snapshot_every=every)
            try:
                cell = node.cell(Counter, "s")
                for _ in range(writes):
                    cell.increment("x")
            finally:
                node.stop()  # waits for a running snapshot and its collection
        snaps = [i.key for i in env.bucket(prefix).list("cells/Counter:s/snap/")]
        node = env.node(prefix, f"third-{run}", snapshot_every=every)
        try:
            before = _gets(node)
            t = time.perf_counter()
            node.cell(Counter, "s").get("x")
            elapsed = time.perf_counter() - t
            requests = _delta(_gets(node), before)
        finally:
            node.stop()
        runs.append(
            {
                "snapshot_written": 1.0 if snaps else 0.0,
                "objects_read": requests["get:batch"] + requests["get:snapshot"],
                "batches_read": requests["get:batch"],
                "snapshots_read": requests["get:snapshot"],
                "chain_txids": 2 * writes + 1,
                "restore_s": elapsed,
            }
        )
    row = make_row(
        "8-snapshot",
        f"two activations of {writes} writes: snapshot bounds the third restore "
        f"(threshold {every} txids)",
        runs,
        metric="snapshot_written",
        metric_fmt="{:.0f}",
        goal=Goal(">=", 1, "a snapshot is written"),
        figure="restore read {objects_read:.0f} objects ({snapshots_read:.0f} snapshot, "
        "{batches_read:.0f} batches) of a {chain_txids:.0f}-txid chain, {restore_s:.3f} s",
    )
    row.metric_text = "yes" if row.met else "no"
    return [row]
