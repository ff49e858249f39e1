"""Row 17: a store far away (:mod:`bench.far_store`: 20 ms added to each PUT, 10 ms to each
GET), in process. One hot cell with 64 writers: acknowledged writes per second and the ack
p50 against one bare PUT+GET pair through the same far bucket; and 256 cells written by 64
clients against bare PUT+GET pairs from 64 threads."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable

from bench.common import CpuMeter, Env, Goal, Load, Row, make_row, thread_load
from bench.far_store import FarBucket
from cellactors import Node, NodeSettings
from cellactors.actors.host import CellProxy
from cellactors.persistence.store.bucket import Bucket
from examples.counter import Counter

PREFIX = "far"
CELLS = 256


class FarPairs:
    """The baseline: a PUT of a batch-sized body to a new key, then a GET of an
    ``own.json``-sized object, through the same far bucket the node uses."""

    def __init__(self, bucket: Bucket, workers: int, own_size: int = 120) -> None:
        self.bucket = bucket
        self._seq = itertools.count()
        for w in range(workers):
            bucket.put(f"pairs/w{w}/own.json", b"o" * own_size)

    def pair(self, worker: int, body: bytes) -> None:
        self.bucket.put(f"pairs/w{worker}/{next(self._seq):012d}", body)
        self.bucket.get(f"pairs/w{worker}/own.json")


def _measure(env: Env, fn: Callable[[], Load]) -> tuple[Load, dict[str, float]]:
    with CpuMeter(env.pids()) as meter:
        load = fn()
    return load, meter.figures(max(1, load.done))


def row17(env: Env) -> list[Row]:
    """The far-store rows (in process: the node's CPU is this process's)."""
    sizes = env.sizes
    far = FarBucket(env.bucket(PREFIX))
    settings = NodeSettings(advertise="127.0.0.1:9", data_dir=env.workdir / "far-nodes")
    node = Node(far, "far", [Counter], settings).start()
    try:
        writers = sizes.writers
        cells = max(8, int(CELLS * min(1.0, sizes.window / 1.5)))
        hot = node.cell(Counter, "hot")
        hot.increment("w")
        many = [node.cell(Counter, f"c{i}") for i in range(cells)]
        for cell in many:
            cell.increment("w")
        pairs = FarPairs(FarBucket(env.bucket(PREFIX + "-pairs")), writers)
        body = b"b" * 300
        hot_runs, many_runs = [], []
        for _ in range(sizes.runs):
            base, _ = _measure(env, lambda: thread_load([_one_pair(pairs, 0, body)], sizes.window))
            load, cpu = _measure(env, lambda: thread_load([_adder(hot)] * writers, sizes.window))
            hot_runs.append(
                {
                    "writes_per_s": load.rate,
                    "p50_ms": load.p50_ms,
                    "pair_p50_ms": base.p50_ms,
                    "p50_ratio": load.p50_ms / base.p50_ms if base.p50_ms else 0.0,
                    "errors": load.errors,
                }
                | cpu
            )
            ops = [_one_pair(pairs, w, body) for w in range(writers)]
            base, _ = _measure(env, functools.partial(thread_load, ops, sizes.window))
            clients = [_round_robin(many[w::writers]) for w in range(writers)]
            load, cpu = _measure(env, functools.partial(thread_load, clients, sizes.window))
            many_runs.append(
                {
                    "writes_per_s": load.rate,
                    "p50_ms": load.p50_ms,
                    "pairs_per_s": base.rate,
                    "ratio": load.rate / base.rate if base.rate else 0.0,
                    "errors": load.errors,
                }
                | cpu
            )
    finally:
        node.stop()
    hot_title = f"far store: one cell, {writers} writers"
    return [
        make_row(
            "17-far-hot-rate",
            hot_title + ": acknowledged writes/s",
            hot_runs,
            metric="writes_per_s",
            metric_fmt="{:.0f}/s",
            goal=Goal(">=", 1500, ">= 1,500/s"),
            figure="{writes_per_s:.0f} writes/s, p50 {p50_ms:.1f} ms",
        ),
        make_row(
            "17-far-hot-p50",
            hot_title + ": ack p50 vs one PUT+GET",
            hot_runs,
            metric="p50_ratio",
            metric_fmt="{:.2f}x",
            goal=Goal("<=", 1.3, "<= 1.3x"),
            figure="p50 {p50_ms:.1f} ms",
            baseline="PUT+GET p50 {pair_p50_ms:.1f} ms",
        ),
        make_row(
            "17-far-cells",
            f"far store: {cells} cells, {writers} clients: writes/s vs PUT+GET pairs/s",
            many_runs,
            metric="ratio",
            metric_fmt="{:.2f}x",
            goal=Goal(">=", 0.9, ">= 0.9x"),
            figure="{writes_per_s:.0f} writes/s, p50 {p50_ms:.1f} ms",
            baseline="{pairs_per_s:.0f} PUT+GET/s",
        ),
    ]


def _one_pair(pairs: FarPairs, worker: int, body: bytes) -> Callable[[], object]:
    return lambda: pairs.pair(worker, body)


def _adder(cell: CellProxy) -> Callable[[], object]:
    return lambda: cell.increment("w")


def _round_robin(cells: list[CellProxy]) -> Callable[[], object]:
    """One client: a write to each of its cells in turn."""
    turn = itertools.cycle(cells)
    return lambda: next(turn).increment("w")
