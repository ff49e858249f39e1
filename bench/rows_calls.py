"""Rows 1-4 and 12: calls on warm cells, in process and over HTTP, against bare boto3 PUT+GET
(writes) and a bare Starlette endpoint (reads).

Every measurement also records the CPU each process used per operation (``cpu_ms_bench``:
this process, the client and, in process, the node; ``cpu_ms_node``: the ``cellactors
serve`` process; ``cpu_ms_store``: SeaweedFS) and how busy the machine was, so that a row
that misses its goal says where its time went."""

from __future__ import annotations

import functools
import itertools
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from bench import http
from bench.common import (
    BareS3,
    CpuMeter,
    Env,
    Goal,
    Load,
    Row,
    make_row,
    object_sizes,
    run_parallel,
    thread_load,
)
from bench.procs import BareProc, NodeProc
from cellactors import Node
from cellactors.actors.host import CellProxy
from cellactors.core import lease_rules
from cellactors.errors import BucketError
from cellactors.persistence.control.leases import LeaseStore
from examples.counter import Counter

PREFIX_INPROC = "calls-inproc"
PREFIX_HTTP = "calls-http"
Figures = dict[str, float]


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

    def measure(
        self, fn: Callable[[], Load], *, server: int | None = None, prefix: str = ""
    ) -> tuple[Load, Figures]:
        """Run ``fn`` under a CPU meter (this process, the store, and ``server`` if given);
        the load and its CPU figures per operation, keys prefixed with ``prefix``."""
        pids = self.env.pids()
        if server is not None:
            pids["node"] = server
        with CpuMeter(pids) as meter:
            load = fn()
        return load, {prefix + k: v for k, v in meter.figures(load.done).items()}

    def baseline(self, n: int) -> tuple[Load, Figures]:
        """``n`` sequential bare PUT+GET pairs, figures prefixed ``baseline_``."""
        return self.measure(lambda: self.bare.sequential(n, self.batch_body), prefix="baseline_")


def _counts(node: Node) -> tuple[int, int]:
    """(batch PUTs, ``own.json`` GETs) the in-process node has sent."""
    counts = node.bucket.snapshot()
    return counts[("put", "batch")], counts[("get", "own")]


def _server_counts(server: NodeProc) -> tuple[int, int]:
    """(batch PUTs, ``own.json`` GETs) the served node has sent."""
    counts = server.bucket_counts()
    return counts.get(("put", "batch"), 0), counts.get(("get", "own"), 0)


def _sequential_writes(cell: CellProxy, n: int) -> Load:
    lat = []
    start = time.perf_counter()
    for _ in range(n):
        t = time.perf_counter()
        cell.increment("x")
        lat.append(time.perf_counter() - t)
    return Load(n, time.perf_counter() - start, lat)


# --------------------------------------------------------------------------- row 1


def row1(calls: Calls) -> list[Row]:
    """Lone write acknowledgement p50 vs bare PUT+GET p50, in process and over HTTP."""
    n = calls.env.sizes.lone_writes
    cell = calls.node.cell(Counter, "lone")
    path = http.call_path("lone", "increment")
    url = calls.server.url
    inproc, over_http = [], []
    for _ in range(calls.env.sizes.runs):
        base, base_cpu = calls.baseline(n)
        load, cpu = calls.measure(lambda: _sequential_writes(cell, n))
        inproc.append(_row1_figures(load, base) | cpu | base_cpu)

        base, base_cpu = calls.baseline(n)
        load, cpu = calls.measure(
            lambda: http.sequential(url, path, {"name": "x"}, n), server=calls.server.pid
        )
        raw = http.concurrent(url, [path], {"name": "x"}, calls.env.sizes.window / 2)
        figures = _row1_figures(load, base) | cpu | base_cpu
        figures["raw_client_p50_ms"] = raw.p50_ms
        over_http.append(figures)
    common = {
        "metric": "ratio",
        "metric_fmt": "{:.2f}x",
        "baseline": "PUT+GET p50 {baseline_p50_ms:.2f} ms",
    }
    return [
        make_row(
            "1-inproc",
            "lone write ack p50, in process",
            inproc,
            goal=Goal("<=", 1.2, "<= 1.2x"),
            figure="p50 {ack_p50_ms:.2f} ms",
            **common,
        ),
        make_row(
            "1-http",
            "lone write ack p50, over HTTP",
            over_http,
            goal=Goal("<=", 1.3, "<= 1.3x"),
            figure="p50 {ack_p50_ms:.2f} ms (raw client {raw_client_p50_ms:.2f})",
            note="httpx keep-alive client; 'raw client' is the same call from the minimal "
            "asyncio client of the throughput rows",
            **common,
        ),
    ]


def _row1_figures(load: Load, base: Load) -> Figures:
    return {
        "ack_p50_ms": load.p50_ms,
        "baseline_p50_ms": base.p50_ms,
        "ratio": load.p50_ms / base.p50_ms,
    }


# --------------------------------------------------------------------------- row 2


def row2(calls: Calls) -> list[Row]:
    """One cell, many concurrent writers: acknowledged writes per baseline PUT+GET time."""
    sizes = calls.env.sizes
    cell = calls.node.cell(Counter, "hot")
    cell.increment("w")
    path = http.call_path("hot", "increment")
    http.sequential(calls.server.url, path, {"name": "w"}, 1)
    marks: list[tuple[int, int]] = []  # the server's counts when a window starts

    def mark() -> None:
        marks.append(_server_counts(calls.server))

    inproc, over_http = [], []
    for _ in range(sizes.runs):
        base, base_cpu = calls.baseline(50)
        before = _counts(calls.node)
        load, cpu = calls.measure(lambda: _thread_writes([cell] * sizes.writers, sizes.window))
        inproc.append(_row2_figures(load, before, _counts(calls.node), base) | cpu | base_cpu)

        base, base_cpu = calls.baseline(50)
        load, cpu = calls.measure(
            lambda: http.concurrent(
                calls.server.url, [path] * sizes.writers, {"name": "w"}, sizes.window, mark
            ),
            server=calls.server.pid,
        )
        figures = _row2_figures(load, marks[-1], _server_counts(calls.server), base)
        over_http.append(figures | cpu | base_cpu)
    common = {
        "metric": "per_baseline",
        "metric_fmt": "{:.1f}",
        "figure": "{writes_per_s:.0f} writes/s, {writes_per_put:.1f}/PUT, a PUT every "
        "{batch_cycle_ms:.1f} ms, p50 {p50_ms:.1f} ms",
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


def _row2_figures(
    load: Load, before: tuple[int, int], after: tuple[int, int], base: Load
) -> Figures:
    puts = after[0] - before[0]
    return {
        "writes_per_s": load.rate,
        "per_baseline": load.rate * base.p50_ms / 1000,
        "writes_per_put": load.done / max(1, puts),
        "batch_cycle_ms": 1000 * load.elapsed / max(1, puts),
        "own_gets_per_put": (after[1] - before[1]) / max(1, puts),
        "p50_ms": load.p50_ms,
        "baseline_p50_ms": base.p50_ms,
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
    # Activate every cell first: the rows measure warm cells (each concurrency level writes
    # the first ``conc`` of them).
    names = [f"d{i}" for i in range(max(sizes.distinct))]
    all_cells = [calls.node.cell(Counter, name) for name in names]
    all_paths = [http.call_path(name, "increment") for name in names]
    run_parallel([_incrementer(c) for c in all_cells], 32)
    http.concurrent(calls.server.url, all_paths, {"name": "w"}, 0.0)
    for conc in sizes.distinct:
        cells, paths = all_cells[:conc], all_paths[:conc]
        ops = [_pair(calls.bare, i, calls.batch_body) for i in range(conc)]
        inproc, over_http = [], []
        for _ in range(sizes.runs):
            baseline = functools.partial(thread_load, ops, sizes.window)
            base, base_cpu = calls.measure(baseline, prefix="baseline_")
            load, cpu = calls.measure(functools.partial(_thread_writes, cells, sizes.window))
            inproc.append(_row3_figures(load, base) | cpu | base_cpu)
            base, base_cpu = calls.measure(baseline, prefix="baseline_")
            load, cpu = calls.measure(
                functools.partial(
                    http.concurrent, calls.server.url, paths, {"name": "w"}, sizes.window
                ),
                server=calls.server.pid,
            )
            over_http.append(_row3_figures(load, base) | cpu | base_cpu)
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


def _row3_figures(load: Load, base: Load) -> Figures:
    return {
        "writes_per_s": load.rate,
        "pairs_per_s": base.rate,
        "ratio": load.rate / base.rate if base.rate else 0.0,
        "p50_ms": load.p50_ms,
        "errors": load.errors,
    }


# --------------------------------------------------------------------------- row 4


def row4(calls: Calls) -> list[Row]:
    """Warm reads over HTTP against a bare Starlette endpoint answering the same JSON."""
    sizes = calls.env.sizes
    path = http.call_path("reader", "get")
    url = calls.server.url
    httpx.post(url + http.call_path("reader", "increment"), json={"name": "x"})
    answer = httpx.post(url + path, json={"name": "x"}).content
    bare = BareProc(calls.env.workdir, answer).start().ready()
    local = calls.node.cell(Counter, "reader")
    local.increment("x")
    kwargs = {"name": "x"}
    try:
        one, many = [], []
        per = sizes.window / 2
        for _ in range(sizes.runs):
            node, cpu = calls.measure(
                lambda: http.concurrent(url, [path], kwargs, per), server=calls.server.pid
            )
            base, base_cpu = calls.measure(
                lambda: http.concurrent(bare.url, [path], kwargs, per),
                server=bare.pid,
                prefix="baseline_",
            )
            local_reads = _sequential_reads(local, sizes.reads)
            one.append(
                {
                    "p50_ms": node.p50_ms,
                    "baseline_p50_ms": base.p50_ms,
                    "ratio": node.p50_ms / base.p50_ms,
                    "inproc_p50_ms": local_reads.p50_ms,
                }
                | cpu
                | base_cpu
            )
            conns = [path] * sizes.read_conns
            node, cpu = calls.measure(
                functools.partial(http.concurrent, url, conns, kwargs, sizes.window),
                server=calls.server.pid,
            )
            base, base_cpu = calls.measure(
                functools.partial(http.concurrent, bare.url, conns, kwargs, sizes.window),
                server=bare.pid,
                prefix="baseline_",
            )
            many.append(
                {
                    "reads_per_s": node.rate,
                    "baseline_per_s": base.rate,
                    "ratio": node.rate / base.rate,
                    "p50_ms": node.p50_ms,
                }
                | cpu
                | base_cpu
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


def _sequential_reads(cell: CellProxy, n: int) -> Load:
    lat = []
    start = time.perf_counter()
    for _ in range(n):
        t = time.perf_counter()
        cell.get("x")
        lat.append(time.perf_counter() - t)
    return Load(n, time.perf_counter() - start, lat)


# --------------------------------------------------------------------------- row 12


class LeaseWatch:
    """Reads a node's lease object every ``interval`` seconds in a thread and keeps every
    expiry it saw. A renewal writes ``expires_ms = sent + TTL``, so the differences between
    successive expiries are exactly the gaps between the node's renewal sends."""

    def __init__(self, leases: LeaseStore, node_id: str, interval: float = 0.2) -> None:
        self.leases = leases
        self.node_id = node_id
        self.interval = interval
        self.expiries: list[int] = []
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="lease-watch", daemon=True)

    def __enter__(self) -> LeaseWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _watch(self) -> None:
        while True:
            try:
                snap = self.leases.read_lease(self.node_id, once=True)
            except BucketError:
                self.errors += 1
            else:
                if snap is not None and snap.lease.expires_ms not in self.expiries[-1:]:
                    self.expiries.append(snap.lease.expires_ms)
            if self._stop.wait(self.interval):
                return

    def gaps_s(self) -> list[float]:
        return [(b - a) / 1000 for a, b in itertools.pairwise(self.expiries)]


def row12(calls: Calls) -> list[Row]:
    """The widest write load of row 3 over HTTP, held longer, while the node's lease is
    watched in the bucket: the node must not fence itself, and its renewals should keep
    their TTL/3 cadence."""
    sizes = calls.env.sizes
    server = calls.server
    ttl = server.lease_ttl
    deadline_s = ttl - lease_rules.fence_margin(ttl)
    conc = max(sizes.distinct)
    paths = [http.call_path(f"d{i}", "increment") for i in range(conc)]
    leases = LeaseStore(calls.env.bucket(PREFIX_HTTP), server.name)
    runs: list[Figures] = []
    for _ in range(sizes.runs):
        with LeaseWatch(leases, server.name) as watch:
            load, cpu = calls.measure(
                functools.partial(
                    http.concurrent, server.url, paths, {"name": "w"}, sizes.load_window
                ),
                server=server.pid,
            )
        fenced = server.proc is not None and server.proc.poll() is not None
        if not fenced:
            fenced = httpx.get(server.url + "/healthz", timeout=5).status_code != 200
        gaps = watch.gaps_s() or [float("nan")]
        runs.append(
            {
                "fenced": float(fenced),
                "writes_per_s": load.rate,
                "gap_max_s": max(gaps),
                "gap_p50_s": statistics.median(gaps),
                "renewals": float(len(gaps)),
                "slack_s": deadline_s - max(gaps),
                "deadline_s": deadline_s,
                "errors": load.errors,
            }
            | cpu
        )
        if fenced:
            break  # the node is gone: later runs would measure nothing
    total = sum(r["fenced"] for r in runs)
    for run in runs:
        run["fences"] = total  # the row holds the total, not a median of 0s and 1s
    return [
        make_row(
            "12-lease-under-load",
            f"{conc} cells written for {sizes.load_window:g} s over HTTP: the node's lease",
            runs,
            metric="fences",
            metric_fmt="{:.0f} self-fences",
            goal=Goal("<=", 0, "no self-fence"),
            figure=(
                "{writes_per_s:.0f} writes/s; renewals every {gap_p50_s:.2f} s, longest gap "
                "{gap_max_s:.2f} s (fence after {deadline_s:.0f} s)"
            ),
            note=f"TTL {ttl:g} s, {len(runs)} runs",
        )
    ]
