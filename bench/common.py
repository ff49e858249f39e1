"""What every row shares: sizes, rows and their goals, statistics, the store, bare boto3
(the baseline), in-process nodes, thread load, and process figures (RSS, threads, fds)."""

from __future__ import annotations

import os
import resource
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import boto3
import botocore.config

from cellactors import CellActor, Node, NodeSettings
from cellactors.actors.snapshots import SnapshotPolicy
from cellactors.persistence.store.embedded import SeaweedServer
from cellactors.persistence.store.embedded_keys import S3Credentials
from cellactors.persistence.store.s3 import S3Bucket

REPO = Path(__file__).resolve().parent.parent
COUNTER_APP = REPO / "examples" / "counter.py"
BUCKET = "bench"
ACCESS_KEY = "bench"
SECRET_KEY = "bench-secret"
GIB = 1 << 30


# --------------------------------------------------------------------------- sizes


@dataclass(frozen=True)
class Sizes:
    """How much each row does per run (``--quick`` and ``--scale`` shrink it)."""

    runs: int = 3
    lone_writes: int = 200  # row 1: sequential writes per mode per run
    window: float = 1.5  # rows 2-4: seconds of load per measurement
    writers: int = 64  # row 2: concurrent writers on one cell
    distinct: tuple[int, ...] = (64, 256)  # row 3: cells written concurrently
    reads: int = 400  # row 4: sequential reads on one connection
    read_conns: int = 16  # row 4: connections of the throughput half
    resident_cells: int = 300  # row 5: cells activated in a fresh process
    activations: int = 300  # row 6: cells activated per run
    activation_concurrency: int = 32  # row 6: activations in flight
    chain: int = 1000  # row 7: single-transaction batches in the chain
    snapshot_writes: int = 600  # row 8: writes per activation
    idle_cells: int = 50  # row 9: resident idle cells on the idle node
    idle_window: float = 30.0  # row 9: shortest window (it runs beside the other rows)
    failover_ttl: float = 3.0  # rows 10-11: lease TTL of the fleet
    history: int = 870  # row 11: single-write batches of the cell before its owner dies
    load_window: float = 10.0  # row 12: seconds of the 256-cell load per run
    socket_cells: int = 1000  # row 15: cells holding the idle sockets of the density row
    sockets_per_cell: int = 10  # row 15: idle sockets per cell
    socket_density_runs: int = 1  # row 15: density runs (each opens every socket twice)
    socket_roundtrips: int = 200  # row 15: socket round trips (and as many calls) per run
    broadcast_sockets: int = 1000  # row 15: sockets of the broadcasting cell
    broadcasts: int = 15  # row 15: broadcasts per run
    touched_cells: int = 1000  # row 16: new cells touched once each per run
    hibernate_after: float = 30.0  # row 16: the node's --hibernate-after (its default)
    touched_memory_runs: int = 1  # row 16: runs (each waits twice for cells to hibernate)

    @staticmethod
    def quick() -> Sizes:
        """The ~1 minute smoke run: one run each, smaller counts, shorter windows."""
        return Sizes(
            runs=1,
            lone_writes=100,
            window=1.0,
            reads=200,
            resident_cells=200,
            activations=100,
            snapshot_writes=300,
            idle_window=15.0,
            history=300,
            load_window=3.0,
            socket_cells=50,
            socket_roundtrips=100,
            broadcast_sockets=100,
            broadcasts=10,
            touched_cells=300,
        )

    def scaled(self, factor: float) -> Sizes:
        """Counts and windows times ``factor`` (floors keep every row meaningful)."""
        if factor == 1.0:
            return self

        def n(value: int, floor: int) -> int:
            return max(floor, round(value * factor))

        return replace(
            self,
            lone_writes=n(self.lone_writes, 10),
            window=max(0.3, self.window * factor),
            writers=n(self.writers, 4),
            distinct=tuple(n(c, 4) for c in self.distinct),
            reads=n(self.reads, 10),
            read_conns=n(self.read_conns, 2),
            resident_cells=n(self.resident_cells, 20),
            activations=n(self.activations, 10),
            activation_concurrency=n(self.activation_concurrency, 4),
            chain=n(self.chain, 10),
            snapshot_writes=n(self.snapshot_writes, 6),
            idle_cells=n(self.idle_cells, 2),
            idle_window=max(3.0, self.idle_window * factor),
            history=n(self.history, 10),
            load_window=max(1.0, self.load_window * factor),
            socket_cells=n(self.socket_cells, 5),
            socket_roundtrips=n(self.socket_roundtrips, 20),
            broadcast_sockets=n(self.broadcast_sockets, 10),
            broadcasts=n(self.broadcasts, 3),
            touched_cells=n(self.touched_cells, 20),
            hibernate_after=max(1.0, self.hibernate_after * factor),
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# --------------------------------------------------------------------------- rows


@dataclass(frozen=True)
class Goal:
    """The goal a row's metric is held to, e.g. ``Goal("<=", 1.2, "<= 1.2x")``."""

    op: str
    target: float
    text: str

    def met(self, value: float) -> bool:
        return value <= self.target if self.op == "<=" else value >= self.target


@dataclass
class Row:
    """One line of the table: medians over runs, the goal metric and every run's figures."""

    id: str
    title: str
    figure: str  # the measured figure, formatted
    baseline: str  # the baseline it is compared with, formatted ("" when none)
    metric: float  # the value held to the goal (median over runs)
    metric_text: str
    goal: Goal
    values: dict[str, float]  # median of each per-run figure
    runs: list[dict[str, float]]
    note: str = ""

    @property
    def met(self) -> bool:
        return self.goal.met(self.metric)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["met"] = self.met
        return out


def medians(runs: Sequence[dict[str, float]]) -> dict[str, float]:
    """The median of every key over the runs (keys missing from a run are skipped)."""
    keys: list[str] = []
    for run in runs:
        keys += [k for k in run if k not in keys]
    return {k: statistics.median([r[k] for r in runs if k in r]) for k in keys}


def make_row(
    row_id: str,
    title: str,
    runs: list[dict[str, float]],
    *,
    metric: str,
    metric_fmt: str,
    goal: Goal,
    figure: str,
    baseline: str = "",
    note: str = "",
) -> Row:
    """Build a row from per-run figures; ``figure``, ``baseline`` and ``metric_fmt`` are
    format strings over the medians (``"p50 {ack_p50_ms:.2f} ms"``)."""
    values = medians(runs)
    return Row(
        id=row_id,
        title=title,
        figure=figure.format(**values),
        baseline=baseline.format(**values),
        metric=values[metric],
        metric_text=metric_fmt.format(values[metric]),
        goal=goal,
        values=values,
        runs=runs,
        note=note,
    )


def percentile(samples: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``samples`` by nearest rank; NaN when empty."""
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def ms(seconds: float) -> float:
    return seconds * 1000.0


# --------------------------------------------------------------------------- the store


@dataclass
class Env:
    """The suite's store and scratch space."""

    store: SeaweedServer
    workdir: Path
    sizes: Sizes
    log: Callable[[str], None] = print
    started: float = field(default_factory=time.monotonic)

    @property
    def endpoint(self) -> str:
        return self.store.endpoint

    def bucket(self, prefix: str) -> S3Bucket:
        """A cellactors bucket under ``prefix`` of the suite's bucket."""
        return S3Bucket(
            BUCKET, prefix, endpoint=self.endpoint, access_key=ACCESS_KEY, secret_key=SECRET_KEY
        )

    def pids(self) -> dict[str, int | str]:
        """The processes a CPU meter watches in process: this one and the store."""
        assert self.store.proc is not None
        return {"bench": "self", "store": self.store.proc.pid}

    def spec(self, prefix: str) -> str:
        return f"s3://{BUCKET}/{prefix}"

    def node(
        self,
        prefix: str,
        node_id: str,
        *,
        snapshot_every: int | None = None,
        classes: Sequence[type[CellActor]] = (),
        **settings: Any,
    ) -> Node:
        """A started in-process node serving ``classes`` (the example Counter by default)
        under ``prefix``."""
        from examples.counter import Counter

        policy = SnapshotPolicy() if snapshot_every is None else SnapshotPolicy(snapshot_every)
        node_settings = NodeSettings(
            advertise="127.0.0.1:9",  # never forwarded to: in-process rows use one node
            data_dir=self.workdir / "nodes",
            snapshots=policy,
            **settings,
        )
        served = list(classes) or [Counter]
        return Node(self.bucket(prefix), node_id, served, node_settings).start()


BENCH_KEYS = S3Credentials(ACCESS_KEY, SECRET_KEY)  # the one identity the store accepts


def store_environment() -> None:
    """The S3 identity the store is given (``BENCH_KEYS``), which boto3 signs with
    (subprocesses inherit it)."""
    os.environ["AWS_ACCESS_KEY_ID"] = ACCESS_KEY
    os.environ["AWS_SECRET_ACCESS_KEY"] = SECRET_KEY
    os.environ["CELLACTORS_S3_ACCESS_KEY_ID"] = ACCESS_KEY
    os.environ["CELLACTORS_S3_SECRET_ACCESS_KEY"] = SECRET_KEY


# --------------------------------------------------------------------------- the baseline


class BareS3:
    """The baseline: boto3 alone, configured like cellactors' own client (path addressing,
    checksums only when required, standard retries), PUT of a batch-sized body to a new key
    and GET of an ``own.json``-sized object, the two requests of every acknowledged batch."""

    def __init__(self, endpoint: str, pool: int = 64) -> None:
        session = boto3.session.Session(
            aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY, region_name="us-east-1"
        )
        self.client = session.client(
            "s3",
            endpoint_url=endpoint,
            config=botocore.config.Config(
                s3={"addressing_style": "path"},
                max_pool_connections=pool,
                retries={"mode": "standard", "max_attempts": 5},
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
            ),
        )
        self._seq = 0
        self._lock = threading.Lock()

    def prepare(self, workers: int, own_size: int) -> None:
        """Create the object each worker GETs (``own.json``-sized)."""
        body = b"o" * own_size
        for w in range(workers):
            self.client.put_object(Bucket=BUCKET, Key=f"baseline/w{w}/own.json", Body=body)

    def pair(self, worker: int, body: bytes) -> None:
        """One PUT (to a fresh key, like a batch) and one GET (like the re-read)."""
        with self._lock:
            self._seq += 1
            seq = self._seq
        self.client.put_object(Bucket=BUCKET, Key=f"baseline/w{worker}/{seq:012d}", Body=body)
        self.client.get_object(Bucket=BUCKET, Key=f"baseline/w{worker}/own.json")["Body"].read()

    def sequential(self, n: int, body: bytes) -> Load:
        """``n`` PUT+GET pairs one after another."""
        lat = []
        start = time.perf_counter()
        for _ in range(n):
            t = time.perf_counter()
            self.pair(0, body)
            lat.append(time.perf_counter() - t)
        return Load(n, time.perf_counter() - start, lat)


def object_sizes(bucket: S3Bucket, cell_id: str) -> tuple[int, int]:
    """(size of the cell's newest batch, size of its ``own.json``): the baseline's sizes."""
    batch, own = 0, 0
    newest = ""
    for info in bucket.list(f"cells/{cell_id}/"):
        if info.key.endswith("/own.json"):
            own = info.size
        elif info.key.endswith(".batch") and info.key.rsplit("/", 1)[1] > newest:
            newest, batch = info.key.rsplit("/", 1)[1], info.size
    return batch, own


# --------------------------------------------------------------------------- load


@dataclass
class Load:
    """What a load run did: completed operations, wall time, per-operation latencies."""

    done: int
    elapsed: float
    latencies: list[float]
    errors: int = 0

    @property
    def rate(self) -> float:
        return self.done / self.elapsed if self.elapsed > 0 else 0.0

    @property
    def p50_ms(self) -> float:
        return ms(percentile(self.latencies, 0.5))


def thread_load(ops: Sequence[Callable[[], object]], duration: float) -> Load:
    """Run ``ops[i]`` in a loop on thread i, all starting together, until ``duration``
    passes; operations already started finish and count."""
    lat: list[list[float]] = [[] for _ in ops]
    errors = [0] * len(ops)
    barrier = threading.Barrier(len(ops) + 1)
    deadline = [0.0]

    def worker(i: int) -> None:
        op, mine = ops[i], lat[i]
        barrier.wait()
        while time.perf_counter() < deadline[0]:
            t = time.perf_counter()
            try:
                op()
            except Exception:
                errors[i] += 1
                continue
            mine.append(time.perf_counter() - t)

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(len(ops))]
    for th in threads:
        th.start()
    start = time.perf_counter()
    deadline[0] = start + duration
    barrier.wait()
    for th in threads:
        th.join()
    elapsed = time.perf_counter() - start
    flat = [x for per in lat for x in per]
    return Load(len(flat), elapsed, flat, sum(errors))


def run_parallel(jobs: Iterable[Callable[[], object]], workers: int) -> float:
    """Run every job with ``workers`` threads; the wall time in seconds."""
    import concurrent.futures

    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        for future in [pool.submit(job) for job in jobs]:
            future.result()
    return time.perf_counter() - start


# --------------------------------------------------------------------------- processes


def proc_status(pid: int | str = "self") -> dict[str, int]:
    """RSS (bytes), threads and open fds of a process, from /proc (psutil elsewhere)."""
    status = Path(f"/proc/{pid}/status")
    if status.exists():
        fields = {}
        for line in status.read_text().splitlines():
            key, _, rest = line.partition(":")
            fields[key] = rest.split()
        return {
            "rss": int(fields["VmRSS"][0]) * 1024,
            "threads": int(fields["Threads"][0]),
            "fds": len(os.listdir(f"/proc/{pid}/fd")),
        }
    import psutil  # not Linux: psutil, if installed

    proc = psutil.Process(None if pid == "self" else int(pid))
    return {"rss": proc.memory_info().rss, "threads": proc.num_threads(), "fds": proc.num_fds()}


def cpu_times(pid: int | str = "self") -> tuple[float, float]:
    """(user, system) CPU seconds a process has used (every thread), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def context_switches(pid: int | str = "self") -> int:
    """Voluntary and involuntary context switches of a process: every thread's, ended ones
    included, for this process; the live threads' for another (its long-lived pools)."""
    if pid == "self":
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_nvcsw + usage.ru_nivcsw
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            for line in (task / "status").read_text().splitlines():
                if "ctxt_switches:" in line:
                    total += int(line.split()[1])
        except (FileNotFoundError, ProcessLookupError):
            continue  # the thread ended meanwhile
    return total


def _machine_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine since boot, from /proc/stat."""
    values = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return sum(values) - idle, sum(values)


class CpuMeter:
    """CPU used by named processes over a ``with`` block (user and system time, context
    switches) and how busy the machine was: where a row's time goes (client, node, store)
    and how noisy the machine was. Linux only."""

    def __init__(self, pids: dict[str, int | str]) -> None:
        self.pids = pids
        self.used: dict[str, tuple[float, float, int]] = {}
        self.wall = 0.0
        self.machine_busy = 0.0  # fraction of every CPU, all processes
        self._start: dict[str, tuple[float, float, int]] = {}
        self._t = 0.0
        self._jiffies = (0, 0)

    def _sample(self) -> dict[str, tuple[float, float, int]]:
        return {name: (*cpu_times(pid), context_switches(pid)) for name, pid in self.pids.items()}

    def __enter__(self) -> CpuMeter:
        self._start = self._sample()
        self._jiffies = _machine_jiffies()
        self._t = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self._t
        busy, total = _machine_jiffies()
        end = self._sample()
        self.used = {
            name: (
                end[name][0] - self._start[name][0],
                end[name][1] - self._start[name][1],
                end[name][2] - self._start[name][2],
            )
            for name in self.pids
        }
        self.machine_busy = (busy - self._jiffies[0]) / max(1, total - self._jiffies[1])

    def figures(self, ops: int) -> dict[str, float]:
        """Per operation and process: CPU milliseconds (``cpu_ms_<name>``), the system
        share of it (``sys_pct_<name>``) and context switches (``ctxsw_<name>``); and the
        machine's busy share (all CPUs) and the part of it used by other processes."""
        cpus = os.cpu_count() or 1
        ops = max(1, ops)
        out: dict[str, float] = {}
        ours = 0.0
        for name, (user, system, switches) in self.used.items():
            ours += user + system
            out[f"cpu_ms_{name}"] = ms(user + system) / ops
            out[f"sys_pct_{name}"] = 100 * system / max(1e-9, user + system)
            out[f"ctxsw_{name}"] = switches / ops
        out["machine_busy_pct"] = 100 * self.machine_busy
        out["others_busy_pct"] = max(0.0, 100 * (self.machine_busy - ours / (self.wall * cpus)))
        return out
