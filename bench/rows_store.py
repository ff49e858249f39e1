"""Row 13: what syncing costs. The embedded store syncs each object before it answers its PUT
(``SeaweedServer(sync=True)``, the default); the same measurements on a store started as
``weed mini`` comes (``sync=False``), the two started in turn (which goes first alternates
from run to run): p50 of sequential bare PUTs of a batch-sized body, and of a lone
acknowledged write (one batch PUT and one ``own.json`` GET) of an in-process node."""

from __future__ import annotations

import dataclasses
import time

from bench.common import BUCKET, BareS3, Env, Goal, Load, Row, make_row, object_sizes
from cellactors.persistence.embedded import SeaweedServer
from examples.counter import Counter

PREFIX = "sync"
Figures = dict[str, float]


def _puts(bare: BareS3, n: int, body: bytes) -> Load:
    """``n`` sequential PUTs of ``body`` to fresh keys."""
    lat = []
    start = time.perf_counter()
    for i in range(n):
        t = time.perf_counter()
        bare.client.put_object(Bucket=BUCKET, Key=f"sync-puts/{i:08d}", Body=body)
        lat.append(time.perf_counter() - t)
    return Load(n, time.perf_counter() - start, lat)


def _lone_writes(env: Env, n: int) -> tuple[Load, int]:
    """``n`` sequential writes on one warm cell of a node on ``env``'s store; the load and
    the size of one write's batch."""
    node = env.node(PREFIX, "sync")
    try:
        cell = node.cell(Counter, "lone")
        for _ in range(3):
            cell.increment("x")  # activated, its volumes made
        batch, _ = object_sizes(env.bucket(PREFIX), "Counter:lone")
        lat = []
        start = time.perf_counter()
        for _ in range(n):
            t = time.perf_counter()
            cell.increment("x")
            lat.append(time.perf_counter() - t)
        return Load(n, time.perf_counter() - start, lat), batch
    finally:
        node.stop()


def _measure(env: Env, folder: str, sync: bool) -> Figures:
    """Start a store ``sync`` or not, measure lone writes and bare PUTs on it, stop it."""
    n = env.sizes.lone_writes
    suffix = "on" if sync else "off"
    with SeaweedServer(env.workdir / folder, sync=sync) as store:
        on_store = dataclasses.replace(env, store=store, workdir=env.workdir / f"{folder}-nodes")
        on_store.bucket("").ensure_exists()
        writes, batch = _lone_writes(on_store, n)
        bare = BareS3(store.endpoint)
        bare.client.put_object(Bucket=BUCKET, Key="sync-puts/warm", Body=b"w" * batch)
        puts = _puts(bare, n, b"b" * batch)
    return {f"put_p50_ms_{suffix}": puts.p50_ms, f"write_p50_ms_{suffix}": writes.p50_ms}


def row13(env: Env) -> list[Row]:
    """PUT and lone-write p50 with the store syncing vs not; the ratios."""
    runs = []
    for run in range(env.sizes.runs):
        order = (True, False) if run % 2 else (False, True)
        figures: Figures = {}
        for sync in order:
            figures |= _measure(env, f"sync-{run}-{'on' if sync else 'off'}", sync)
        figures["put_ratio"] = figures["put_p50_ms_on"] / figures["put_p50_ms_off"]
        figures["write_ratio"] = figures["write_p50_ms_on"] / figures["write_p50_ms_off"]
        runs.append(figures)
    return [
        make_row(
            "13-store-sync",
            "lone write ack p50, embedded store syncing vs not",
            runs,
            metric="write_ratio",
            metric_fmt="{:.2f}x",
            goal=Goal("<=", 2.0, "<= 2x"),
            figure="write p50 {write_p50_ms_on:.2f} ms, PUT p50 {put_p50_ms_on:.2f} ms "
            "({put_ratio:.2f}x)",
            baseline="not syncing: write p50 {write_p50_ms_off:.2f} ms, "
            "PUT p50 {put_p50_ms_off:.2f} ms",
            note="each run starts the store both ways in turn (the first alternates); PUTs "
            "are bare boto3 PUTs of a batch-sized body; the disk's sync latency sets the cost",
        )
    ]
