"""Row 16: memory a touched cell leaves behind. A ``cellactors serve`` node on its embedded
store (default settings: a cell hibernates after 30 s without a call) gets one write on
each of ``touched_cells`` new cells; 35 s after the last one (every cell hibernated), the
growth of the node's and the store's resident memory (``VmRSS``) is divided by the cells.

The baseline is taken the same way after a warm-up: as many cells as the node's pools need
to reach their size are touched, left to hibernate, and only then is RSS read, so that
what is counted is what each new cell keeps, not what the first ones set up."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from bench.common import Env, Goal, Row, make_row, proc_status, run_parallel
from bench.http import HEADERS, call_path
from bench.procs import NodeProc

KIB = 1024
#: Cells touched before the baseline (the node's thread pools and caches reach their size).
WARM = 64
CONCURRENCY = 16
#: Seconds after a cell hibernates (``--hibernate-after``) that its memory is read.
SETTLE_S = 5.0


def children(pid: int) -> list[int]:
    """The child processes of ``pid`` (every thread's), from /proc."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue  # the thread ended meanwhile
    return found


def store_pid(node_pid: int) -> int:
    """The embedded store's process: the node's ``weed`` child."""
    for pid in children(node_pid):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == "weed":
                return pid
        except FileNotFoundError:
            continue
    raise RuntimeError(f"node {node_pid} has no weed child")


class Toucher:
    """One write on each of many new cells over HTTP, a keep-alive client per thread."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self._local = threading.local()
        self._clients: list[httpx.Client] = []
        self._lock = threading.Lock()

    def _client(self) -> httpx.Client:
        client: httpx.Client | None = getattr(self._local, "client", None)
        if client is None:
            client = self._local.client = httpx.Client(base_url=self.base_url, timeout=60)
            with self._lock:
                self._clients.append(client)
        return client

    def touch(self, name: str) -> Callable[[], object]:
        body = json.dumps({"name": "x"}).encode()

        def run() -> None:
            resp = self._client().post(call_path(name, "increment"), content=body, headers=HEADERS)
            resp.raise_for_status()

        return run

    def many(self, names: list[str]) -> float:
        """Touch every cell of ``names``; the wall time."""
        return run_parallel([self.touch(n) for n in names], CONCURRENCY)

    def close(self) -> None:
        for client in self._clients:
            client.close()


def gauges(node: NodeProc) -> dict[str, float]:
    """The node's resident and hibernated cells, from /metrics."""
    text = httpx.get(node.internal_url + "/metrics", timeout=5).text
    out: dict[str, float] = {}
    for line in text.splitlines():
        for name in ("resident_cells", "hibernated_cells"):
            if line.startswith(f"cellactors_{name} "):
                out[name] = float(line.split()[1])
    return out


def _memory(node: NodeProc, store: int) -> dict[str, int]:
    return {"node": proc_status(node.pid)["rss"], "store": proc_status(store)["rss"]}


def one_run(env: Env, run: int) -> dict[str, float]:
    """Start a node on its embedded store, warm it, touch the cells, read the growth."""
    sizes = env.sizes
    n, hibernate = sizes.touched_cells, sizes.hibernate_after
    extra = () if hibernate == 30.0 else ("--hibernate-after", str(hibernate))
    node = NodeProc(f"memory-{run}", env.workdir / "memory", None, None, extra=extra)
    node.start()
    toucher = Toucher(node.url)
    try:
        node.ready(timeout=120)
        store = store_pid(node.pid)
        toucher.many([f"warm-{run}-{i}" for i in range(WARM)])
        time.sleep(hibernate + SETTLE_S)  # the warm cells hibernate: the baseline's state
        before = _memory(node, store)
        names = [f"touched-{run}-{i}" for i in range(n)]
        elapsed = toucher.many(names)
        last_touch = time.monotonic()
        touched = _memory(node, store)
        time.sleep(max(0.0, last_touch + hibernate + SETTLE_S - time.monotonic()))
        after = _memory(node, store)
        cells = gauges(node)
    finally:
        toucher.close()
        node.stop()
    return {
        "node_kib_per_cell": (after["node"] - before["node"]) / n / KIB,
        "store_kib_per_cell": (after["store"] - before["store"]) / n / KIB,
        "node_touched_kib_per_cell": (touched["node"] - before["node"]) / n / KIB,
        "store_touched_kib_per_cell": (touched["store"] - before["store"]) / n / KIB,
        "node_before_mib": before["node"] / KIB / KIB,
        "store_before_mib": before["store"] / KIB / KIB,
        "touches_per_s": n / elapsed,
        "resident_after": cells.get("resident_cells", -1),
        "hibernated_after": cells.get("hibernated_cells", -1),
    }


def row16(env: Env) -> list[Row]:
    sizes = env.sizes
    runs = [one_run(env, run) for run in range(sizes.touched_memory_runs)]
    wait = sizes.hibernate_after + SETTLE_S
    return [
        make_row(
            "16-touched-memory",
            f"RSS growth per touched cell {wait:g} s after the touch ({sizes.touched_cells} "
            f"new cells, one write each, `serve` on its embedded store, hibernation after "
            f"{sizes.hibernate_after:g} s)",
            runs,
            metric="node_kib_per_cell",
            metric_fmt="{:.1f} KiB",
            goal=Goal("<=", 32, "node <= 32 KiB"),
            figure="node {node_kib_per_cell:.1f} KiB, store {store_kib_per_cell:.1f} KiB per "
            "cell ({node_touched_kib_per_cell:.0f} and {store_touched_kib_per_cell:.0f} KiB "
            "right after the touches); {hibernated_after:.0f} hibernated, "
            "{resident_after:.0f} resident",
            baseline="node {node_before_mib:.0f} MiB, store {store_before_mib:.0f} MiB after "
            f"{WARM} warm cells hibernated",
        )
    ]
