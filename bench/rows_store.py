"""Row 13: what syncing costs. The embedded store syncs each object before it answers its PUT
(``SeaweedServer(sync=True)``, the default). Each run starts it both ways, side by side
(``sync=False`` is ``weed mini`` as it comes), and alternates short blocks of the same work
on the two, so that the machine's changing speed falls on both alike: lone acknowledged
writes of an in-process node on one warm cell (one batch PUT and one ``own.json`` GET each),
and sequential bare boto3 PUTs of a batch-sized body."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from bench.common import (
    BENCH_KEYS,
    BUCKET,
    BareS3,
    Env,
    Goal,
    Row,
    make_row,
    ms,
    object_sizes,
    percentile,
)
from cellactors.persistence.store.embedded import SeaweedServer
from examples.counter import Counter

PREFIX = "sync"
BLOCK = 20  # operations of one kind on one store before switching to the other
Figures = dict[str, float]


@dataclass
class _Side:
    """One store of a run and what its measurements use."""

    name: str  # "on" or "off"
    write: Callable[[], object]  # one lone acknowledged write
    put: Callable[[], object]  # one bare PUT of a batch-sized body
    writes: list[float] = dataclasses.field(default_factory=list)
    puts: list[float] = dataclasses.field(default_factory=list)


@contextlib.contextmanager
def _side(env: Env, folder: str, sync: bool) -> Iterator[_Side]:
    """A store started ``sync`` or not, a node with a warm cell on it, a bare client."""
    with SeaweedServer(env.workdir / folder, sync=sync, credentials=BENCH_KEYS) as store:
        on_store = dataclasses.replace(env, store=store, workdir=env.workdir / f"{folder}-nodes")
        on_store.bucket("").ensure_exists()
        node = on_store.node(PREFIX, "sync")
        try:
            cell = node.cell(Counter, "lone")
            for _ in range(3):
                cell.increment("x")  # activated, its volumes made
            batch, _ = object_sizes(on_store.bucket(PREFIX), "Counter:lone")
            bare, body, seq = BareS3(store.endpoint), b"b" * batch, iter(range(10**9))
            bare.client.put_object(Bucket=BUCKET, Key="sync-puts/warm", Body=body)

            def put() -> object:
                key = f"sync-puts/{next(seq):09d}"
                return bare.client.put_object(Bucket=BUCKET, Key=key, Body=body)

            yield _Side("on" if sync else "off", lambda: cell.increment("x"), put)
        finally:
            node.stop()


def _block(op: Callable[[], object], n: int, into: list[float]) -> None:
    for _ in range(n):
        t = time.perf_counter()
        op()
        into.append(time.perf_counter() - t)


def _run(env: Env, run: int) -> Figures:
    """Both stores side by side, ``lone_writes`` of each operation on each, in blocks."""
    n = env.sizes.lone_writes
    with contextlib.ExitStack() as stack:
        sides = [
            stack.enter_context(_side(env, f"sync-{run}-{'on' if sync else 'off'}", sync))
            for sync in ((True, False) if run % 2 else (False, True))
        ]
        for block in range(max(1, n // BLOCK)):
            for side in sides if block % 2 == 0 else sides[::-1]:
                _block(side.write, BLOCK, side.writes)
                _block(side.put, BLOCK, side.puts)
    figures: Figures = {}
    for side in sides:
        figures[f"write_p50_ms_{side.name}"] = ms(percentile(side.writes, 0.5))
        figures[f"put_p50_ms_{side.name}"] = ms(percentile(side.puts, 0.5))
    figures["write_ratio"] = figures["write_p50_ms_on"] / figures["write_p50_ms_off"]
    figures["put_ratio"] = figures["put_p50_ms_on"] / figures["put_p50_ms_off"]
    return figures


def row13(env: Env) -> list[Row]:
    """Lone-write and PUT p50 with the store syncing vs not; the ratios."""
    runs = [_run(env, run) for run in range(env.sizes.runs)]
    return [
        make_row(
            "13-store-sync",
            "lone write ack p50, embedded store syncing vs not",
            runs,
            metric="write_ratio",
            metric_fmt="{:.2f}x",
            goal=Goal("<=", 2.0, "<= 2x"),
            figure="write p50 {write_p50_ms_on:.2f} ms; PUT p50 {put_p50_ms_on:.2f} ms "
            "({put_ratio:.2f}x)",
            baseline="not syncing: write p50 {write_p50_ms_off:.2f} ms; "
            "PUT p50 {put_p50_ms_off:.2f} ms",
            note=f"both stores run side by side, the work alternating between them in blocks "
            f"of {BLOCK}; PUTs are bare boto3 PUTs of a batch-sized body; each synced PUT "
            "costs two syncs (the volume's .dat, the filer's SQLite log), so the disk's "
            "flush latency sets the cost",
        )
    ]
