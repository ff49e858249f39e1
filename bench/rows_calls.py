"""Rows 1-4: calls on warm cells, in process and over HTTP, against bare boto3 PUT+GET
(writes) and a bare Starlette endpoint (reads)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from bench import http
from bench.common import (
    BareS3,
    Env,
    Goal,
    Load,
    Row,
    make_row,
    ms,
    object_sizes,
    run_parallel,
    thread_load,
)
from bench.procs import BareProc, NodeProc
from cellactors import Node
from cellactors.actors.host import CellProxy
from examples.counter import Counter

PREFIX_INPROC = "calls-inproc"
PREFIX_HTTP = "calls-http"


@dataclass
class Calls:
    """What rows 1-4 share: an in-process node, a ``cellactors serve`` node, the baseline."""

    env: Env
    node: Node
    server: NodeProc
    bare: BareS3
    batch_body: bytes  # the size of one increment's batch
    own_size: int

    @classmethod
    def start(cls, env: Env, server: NodeProc) -> Calls:
        """Start the in-process node, warm the lone cell, size the baseline like it."""
        node = env.node(PREFIX_INPROC, "inproc")
        for _ in range(3):
            node.cell(Counter, "lone").increment("x")
        batch, own = object_sizes(env.bucket(PREFIX_INPROC), "Counter:lone")
        bare = BareS3(env.endpoint, pool=max(64, *env.sizes.distinct))
        bare.prepare(max(env.sizes.distinct), own)
        server.ready()
        return cls(env, node, server, bare, b"b" * batch, own)

    def stop(self) -> None:
        self.node.stop()

    def baseline_p50(self, n: int) -> float:
        """p50 (seconds) of ``n`` sequential bare PUT+GET pairs."""
        return self.bare.sequential_p50(n, self.batch_body)


def _batch_puts(node: Node) -> int:
    return node.bucket.snapshot()[("put", "batch")]


def _server_batch_puts(server: NodeProc) -> int:
    return server.bucket_counts().get(("put", "batch"), 0)


# --------------------------------------------------------------------------- row 1


def row1(calls: Calls) -> list[Row]:
    """Lone write acknowledgement p50 vs bare PUT+GET p50, in process and over HTTP."""
    n = calls.env.sizes.lone_writes
    cell = calls.node.cell(Counter, "lone")
    path = http.call_path("lone", "increment")
    inproc, over_http = [], []
    for _ in range(calls.env.sizes.runs):
        base = calls.baseline_p50(n)
        lat = []
        for _ in range(n):
            t = time.perf_counter()
            cell.increment("x")
            lat.append(time.perf_counter() - t)
        ack = Load(n, sum(lat), lat).p50_ms
        inproc.append({"ack_p50_ms": ack, "baseline_p50_ms": ms(base), "ratio": ack / ms(base)})

        base = calls.baseline_p50(n)
        load = http.sequential(calls.server.url, path, {"name": "x"}, n)
        raw = http.concurrent(calls.server.url, [path], {"name": "x"}, calls.env.sizes.window / 2)
        over_http.append(
            {
                "ack_p50_ms": load.p50_ms,
                "raw_client_p50_ms": raw.p50_ms,
                "baseline_p50_ms": ms(base),
                "ratio": load.p50_ms / ms(base),
            }
        )
    return [
        make_row(
            "1-inproc",
            "lone write ack p50, in process",
            inproc,
            metric="ratio",
            metric_fmt="{:.2f}x",
            goal=Goal("<=", 1.2, "<= 1.2x"),
            figure="p50 {ack_p50_ms:.2f} ms",
            baseline="PUT+GET p50 {baseline_p50_ms:.2f} ms",
        ),
        make_row(
            "1-http",
            "lone write ack p50, over HTTP",
            over_http,
            metric="ratio",
            metric_fmt="{:.2f}x",
            goal=Goal("<=", 1.3, "<= 1.3x"),
            figure="p50 {ack_p50_ms:.2f} ms (raw client {raw_client_p50_ms:.2f})",
            baseline="PUT+GET p50 {baseline_p50_ms:.2f} ms",
            note="httpx keep-alive client; 'raw client' is the same call from the minimal "
            "asyncio client",
        ),
    ]


# --------------------------------------------------------------------------- row 2


def row2(calls: Calls) -> list[Row]:
    """One cell, many concurrent writers: acknowledged writes per baseline PUT+GET time."""
    sizes = calls.env.sizes
    cell = calls.node.cell(Counter, "hot")
    cell.increment("w")
    path = http.call_path("hot", "increment")
    http.sequential(calls.server.url, path, {"name": "w"}, 1)
    marks: list[int] = []  # batch PUTs of the server when a window starts (after warm-up)

    def mark() -> None:
        marks.append(_server_batch_puts(calls.server))

    inproc, over_http = [], []
    for _ in range(sizes.runs):
        base = calls.baseline_p50(50)
        before = _batch_puts(calls.node)
        load = _thread_writes([cell] * sizes.writers, sizes.window)
        puts = _batch_puts(calls.node) - before
        inproc.append(_row2_figures(load, puts, base))

        base = calls.baseline_p50(50)
        load = http.concurrent(
            calls.server.url, [path] * sizes.writers, {"name": "w"}, sizes.window, mark
        )
        puts = _server_batch_puts(calls.server) - marks[-1]
        over_http.append(_row2_figures(load, puts, base))
    common = {
        "metric": "per_baseline",
        "metric_fmt": "{:.1f}",
        "figure": "{writes_per_s:.0f} writes/s, {writes_per_put:.1f}/PUT, p50 {p50_ms:.1f} ms",
        "baseline": "PUT+GET p50 {baseline_p50_ms:.2f} ms",
    }
    w = sizes.writers
    return [
        make_row(
            "2-inproc",
            f"one cell, {w} writers: writes per PUT+GET time, in process",
            inproc,
            goal=Goal(">=", 25, ">= 25"),
            **common,
        ),
        make_row(
            "2-http",
            f"one cell, {w} writers: writes per PUT+GET time, over HTTP",
            over_http,
            goal=Goal(">=", 20, ">= 20"),
            **common,
        ),
    ]


def _row2_figures(load: Load, puts: int, base: float) -> dict[str, float]:
    return {
        "writes_per_s": load.rate,
        "per_baseline": load.rate * base,
        "writes_per_put": load.done / max(1, puts),
        "p50_ms": load.p50_ms,
        "baseline_p50_ms": ms(base),
        "errors": load.errors,
    }


def _thread_writes(cells: list[CellProxy], duration: float) -> Load:
    """Thread i increments ``cells[i]`` in a loop for ``duration`` seconds."""
    return thread_load([_incrementer(c) for c in cells], duration)


def _incrementer(cell: CellProxy) -> Callable[[], object]:
    return lambda: cell.increment("w")


# --------------------------------------------------------------------------- row 3


def row3(calls: Calls) -> list[Row]:
    """Distinct cells written concurrently: writes/s vs bare PUT+GET pairs/s."""
    sizes = calls.env.sizes
    rows: list[Row] = []
    for conc in sizes.distinct:
        names = [f"d{conc}-{i}" for i in range(conc)]
        cells = [calls.node.cell(Counter, name) for name in names]
        paths = [http.call_path(name, "increment") for name in names]
        # Activate every cell first (and open the connections): the rows measure warm cells.
        run_parallel([_incrementer(c) for c in cells], 32)
        http.concurrent(calls.server.url, paths, {"name": "w"}, 0.0)
        inproc, over_http = [], []
        for _ in range(sizes.runs):
            body = calls.batch_body
            ops = [_pair(calls.bare, i, body) for i in range(conc)]
            base = thread_load(ops, sizes.window).rate
            load = _thread_writes(cells, sizes.window)
            inproc.append(_row3_figures(load, base))
            base = thread_load(ops, sizes.window).rate
            load = http.concurrent(calls.server.url, paths, {"name": "w"}, sizes.window)
            over_http.append(_row3_figures(load, base))
        for mode, runs in (("inproc", inproc), ("http", over_http)):
            where = "in process" if mode == "inproc" else "over HTTP"
            rows.append(
                make_row(
                    f"3-{mode}-{conc}",
                    f"{conc} cells written concurrently, {where}",
                    runs,
                    metric="ratio",
                    metric_fmt="{:.2f}x",
                    goal=Goal(">=", 0.9, ">= 0.9x"),
                    figure="{writes_per_s:.0f} writes/s, p50 {p50_ms:.1f} ms",
                    baseline="{pairs_per_s:.0f} PUT+GET/s",
                )
            )
    return rows


def _pair(bare: BareS3, worker: int, body: bytes) -> Callable[[], object]:
    return lambda: bare.pair(worker, body)


def _row3_figures(load: Load, pairs_per_s: float) -> dict[str, float]:
    return {
        "writes_per_s": load.rate,
        "pairs_per_s": pairs_per_s,
        "ratio": load.rate / pairs_per_s if pairs_per_s else 0.0,
        "p50_ms": load.p50_ms,
        "errors": load.errors,
    }


# --------------------------------------------------------------------------- row 4


def row4(calls: Calls) -> list[Row]:
    """Warm reads over HTTP against a bare Starlette endpoint answering the same JSON."""
    sizes = calls.env.sizes
    path = http.call_path("reader", "get")
    httpx.post(calls.server.url + http.call_path("reader", "increment"), json={"name": "x"})
    answer = httpx.post(calls.server.url + path, json={"name": "x"}).content
    bare = BareProc(calls.env.workdir, answer).start().ready()
    local = calls.node.cell(Counter, "reader")
    local.increment("x")
    try:
        one, many = [], []
        per = sizes.window / 2
        for _ in range(sizes.runs):
            node = http.concurrent(calls.server.url, [path], {"name": "x"}, per)
            base = http.concurrent(bare.url, [path], {"name": "x"}, per)
            lat = []
            for _ in range(sizes.reads):
                t = time.perf_counter()
                local.get("x")
                lat.append(time.perf_counter() - t)
            one.append(
                {
                    "p50_ms": node.p50_ms,
                    "baseline_p50_ms": base.p50_ms,
                    "ratio": node.p50_ms / base.p50_ms,
                    "inproc_p50_ms": Load(len(lat), sum(lat), lat).p50_ms,
                }
            )
            conns = [path] * sizes.read_conns
            node = http.concurrent(calls.server.url, conns, {"name": "x"}, sizes.window)
            base = http.concurrent(bare.url, conns, {"name": "x"}, sizes.window)
            many.append(
                {
                    "reads_per_s": node.rate,
                    "baseline_per_s": base.rate,
                    "ratio": node.rate / base.rate,
                    "p50_ms": node.p50_ms,
                }
            )
    finally:
        bare.stop()
    return [
        make_row(
            "4-read-1conn",
            "warm read over HTTP, 1 connection: p50",
            one,
            metric="ratio",
            metric_fmt="{:.2f}x",
            goal=Goal("<=", 1.5, "<= 1.5x"),
            figure="p50 {p50_ms:.3f} ms (in process {inproc_p50_ms:.3f} ms)",
            baseline="bare p50 {baseline_p50_ms:.3f} ms",
        ),
        make_row(
            "4-read-16conn",
            f"warm read over HTTP, {sizes.read_conns} connections: requests/s",
            many,
            metric="ratio",
            metric_fmt="{:.2f}x",
            goal=Goal(">=", 0.6, ">= 0.6x"),
            figure="{reads_per_s:.0f} reads/s, p50 {p50_ms:.2f} ms",
            baseline="bare {baseline_per_s:.0f}/s",
        ),
    ]
