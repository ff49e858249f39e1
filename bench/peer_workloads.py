"""The workloads of a peer comparison, each run the same way against every system (a
:class:`Side`): the example counter's ``increment(name, by)`` called over HTTP, with every
acknowledged add recorded so that the counters read back at the end can be checked.

1. one key, sequential calls: p50 latency;
2. one key, many concurrent clients: acknowledged calls per second;
3. many keys, as many clients: acks per second and server CPU per ack;
4. the first call to a never-used key: p50 and server CPU per first call;
5. RSS growth per key touched, some seconds after the touch (:func:`touch`, :func:`growth`).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench import http
from bench.common import CpuMeter, Sizes, proc_status
from bench.peer_load import cycling, first_calls, read_back

Figures = dict[str, float]
ADD = {"name": "n", "by": 1}  # every workload adds 1 to counter "n" of its keys
READ = {"name": "n"}
SETTLE_S = 35.0  # workload 5 measures RSS this long after the touch


@dataclass(frozen=True)
class PeerSizes:
    """How much each workload does per run, from the suite's sizes (``--quick``, ``--scale``)."""

    runs: int
    lone_calls: int  # workload 1
    window: float  # workloads 2-3: seconds of load
    clients: int  # workloads 2-3
    keys: int  # workload 3
    first_calls: int  # workload 4, per run
    touched: int  # workload 5, per run

    @staticmethod
    def of(sizes: Sizes) -> PeerSizes:
        return PeerSizes(
            runs=sizes.runs,
            lone_calls=sizes.lone_writes,
            window=2 * sizes.window,
            clients=sizes.writers,
            keys=max(sizes.distinct),
            first_calls=max(5, sizes.activations // 6),
            touched=sizes.resident_cells,
        )


@dataclass
class Side:
    """One system under load: its URL, how it spells a call's path, the processes that
    count as its server, how a read's answer holds the count, and the adds it acknowledged."""

    name: str
    url: str
    prefix: str  # a call's path is <prefix>/<key>/<method>
    pids: dict[str, int]
    value: Callable[[Any], int]
    acked: Counter[str] = field(default_factory=Counter)  # by increment path
    unacked: int = 0  # calls answered with an error: applied or not, either is correct

    def path(self, key: str, method: str = "increment") -> str:
        return f"{self.prefix}/{key}/{method}"

    def meter(self) -> CpuMeter:
        return CpuMeter(dict(self.pids))

    def rss(self) -> dict[str, int]:
        return {name: proc_status(pid)["rss"] for name, pid in self.pids.items()}

    def server_cpu_ms(self, meter: CpuMeter, ops: int) -> float:
        """The CPU milliseconds per operation of every server process together."""
        figures = meter.figures(ops)
        return sum(figures[f"cpu_ms_{name}"] for name in self.pids)

    def record(self, acks: Counter[str], errors: int) -> None:
        self.acked.update(acks)
        self.unacked += errors

    def check(self) -> list[str]:
        """Read every counter back; what disagrees with the acknowledged adds (every one
        counted exactly once; a call answered with an error may count or not)."""
        paths = sorted(self.acked)
        got = read_back(self.url, [p.rsplit("/", 1)[0] + "/get" for p in paths], READ, self.value)
        problems = []
        extra = 0
        for path, count in zip(paths, got.values(), strict=True):
            if count < self.acked[path]:
                problems.append(f"{self.name} {path}: {count} counted, {self.acked[path]} acked")
            extra += max(0, count - self.acked[path])
        if extra > self.unacked:
            problems.append(f"{self.name}: {extra} adds counted beyond the acknowledged ones")
        return problems


def lone(side: Side, s: PeerSizes, run: int) -> Figures:
    """Workload 1: sequential calls on one key, one keep-alive connection."""
    path = side.path("lone")
    load = http.sequential(side.url, path, ADD, s.lone_calls)
    side.acked[path] += s.lone_calls + 1  # every call (and the warm-up) answered 200
    return {"p50_ms": load.p50_ms}


def hot(side: Side, s: PeerSizes, run: int) -> Figures:
    """Workload 2: every client calls the same key."""
    load, acks = cycling(side.url, [[side.path("hot")]] * s.clients, ADD, s.window)
    side.record(acks, load.errors)
    return {"acks_per_s": load.rate, "errors": load.errors}


def spread(side: Side, s: PeerSizes, run: int) -> Figures:
    """Workload 3: client i calls keys i, i + clients, ... in turn (every key warm)."""
    paths = [side.path(f"k{i}") for i in range(s.keys)]
    clients = min(s.clients, s.keys)
    meter = side.meter()
    load, acks = cycling(
        side.url, [paths[i::clients] for i in range(clients)], ADD, s.window, meter.__enter__
    )
    meter.__exit__(None, None, None)
    side.record(acks, load.errors)
    return {
        "acks_per_s": load.rate,
        "cpu_ms_per_ack": side.server_cpu_ms(meter, load.done),
        "errors": load.errors,
    }


def first(side: Side, s: PeerSizes, run: int) -> Figures:
    """Workload 4: one call to each of ``first_calls`` never-used keys, one at a time."""
    paths = [side.path(f"first-{run}-{i}") for i in range(s.first_calls)]
    meter = side.meter()
    load, acks = first_calls(side.url, paths, ADD, side.path("lone"), meter.__enter__)
    meter.__exit__(None, None, None)
    side.record(acks, load.errors)
    return {"p50_ms": load.p50_ms, "cpu_ms_per_call": side.server_cpu_ms(meter, load.done)}


WORKLOADS: tuple[Callable[[Side, PeerSizes, int], Figures], ...] = (lone, hot, spread, first)


@dataclass
class Touch:
    """Workload 5 in progress: RSS before ``touched`` fresh keys were called, and when."""

    side: Side
    before: dict[str, int]
    touched: int
    at: float


def touch(side: Side, s: PeerSizes, run: int) -> Touch:
    """Call ``touched`` never-used keys once each; RSS is taken right before."""
    before = side.rss()
    paths = [side.path(f"rss-{run}-{i}") for i in range(s.touched)]
    load, acks = first_calls(side.url, paths, ADD, side.path("lone"))
    side.record(acks, load.errors)
    return Touch(side, before, s.touched, time.monotonic())


def growth(done: Touch, settle: float = SETTLE_S) -> Figures:
    """RSS growth per key touched, in KiB per process, ``settle`` seconds after the touch."""
    wait = done.at + settle - time.monotonic()
    if wait > 0:
        time.sleep(wait)
    after = done.side.rss()
    return {
        f"rss_kib_{name}": (after[name] - done.before[name]) / 1024 / done.touched
        for name in done.side.pids
    }
