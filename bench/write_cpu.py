"""Node CPU per acknowledged write with many cells, comparing code trees side by side.

``python -m bench.write_cpu [TREE ...]`` starts the embedded store and one ``cellactors
serve`` node per source tree (each tree's own ``cellactors`` package and
``examples/counter.py``; this checkout when none is named), warms ``--cells`` Counter cells
on each, then drives each node in turn with ``--clients`` keep-alive HTTP connections, each
writing its share of the cells round-robin, in short windows that alternate between the
nodes (the order reversed every round). Per window: acknowledged writes per second, and CPU
milliseconds per write of the node and of the store, with the node's context switches, from
``/proc``. The medians and, for every tree after the first, the median of its per-round
ratio to the first tree come last. Alternating short windows is what makes a comparison hold
on a shared machine: CPU time per write rises with what else runs, by more than most changes
move it."""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bench.common import (
    ACCESS_KEY,
    BENCH_KEYS,
    BUCKET,
    REPO,
    SECRET_KEY,
    CpuMeter,
    store_environment,
)
from bench.http import _Conn, _request
from bench.procs import ServerProc
from cellactors.persistence.store.embedded import SeaweedServer, die_with_parent, free_port
from cellactors.persistence.store.s3 import S3Bucket

BODY = b'{"name": "w"}'


class TreeNode(ServerProc):
    """``cellactors serve`` run from a source tree (its package first on the path)."""

    def __init__(self, tree: Path, index: int, workdir: Path, endpoint: str) -> None:
        port = free_port()
        name = f"n{index}"
        args = [
            sys.executable,
            "-m",
            "cellactors.cli",
            "serve",
            "--app",
            str(tree / "examples" / "counter.py"),
            "--bucket",
            f"s3://{BUCKET}/write-cpu-{index}",
            "--endpoint",
            endpoint,
            "--node",
            name,
            "--listen",
            f"127.0.0.1:{port}",
            "--internal-listen",
            f"127.0.0.1:{free_port()}",
            "--data-dir",
            str(workdir / name),
            "--log-level",
            "warning",
        ]
        super().__init__(name, args, port, workdir)
        self.tree = tree
        self.label = f"{name} ({tree})"

    def start(self) -> TreeNode:
        """Launch from the tree (its working directory and first on ``PYTHONPATH``)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(self.tree)}
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(
                self.args,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.tree,
                preexec_fn=die_with_parent,
            )
        return self


@dataclass
class Driver:
    """The connections of one node, each with the requests of its share of the cells."""

    conns: list[_Conn]
    requests: list[list[bytes]]

    @classmethod
    async def open(cls, port: int, clients: int, cells: int) -> Driver:
        host = "127.0.0.1"
        requests = [
            [
                _request(host, port, f"/cells/Counter/d{i + k * clients}/increment", BODY)
                for k in range(max(1, cells // clients))
            ]
            for i in range(clients)
        ]
        conns = list(await asyncio.gather(*(_Conn.open(host, port) for _ in range(clients))))
        driver = cls(conns, requests)
        await driver.window(0.0)  # every cell once: activated and warm
        return driver

    async def window(self, seconds: float) -> tuple[int, int]:
        """Write for ``seconds`` (every cell of each connection once when 0): (acknowledged
        writes, other answers)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        counts = [0, 0]

        async def worker(conn: _Conn, requests: list[bytes]) -> None:
            i = 0
            while (seconds == 0 and i < len(requests)) or (seconds and loop.time() < deadline):
                counts[0 if await conn.post(requests[i % len(requests)]) == 200 else 1] += 1
                i += 1

        await asyncio.gather(
            *(worker(c, r) for c, r in zip(self.conns, self.requests, strict=True))
        )
        return counts[0], counts[1]


async def compare(
    nodes: list[TreeNode], store_pid: int, args: argparse.Namespace
) -> dict[str, list[dict[str, float]]]:
    """Alternate windows between the nodes; every window's figures, by tree."""
    drivers = [await Driver.open(n.port, args.clients, args.cells) for n in nodes]
    runs: dict[str, list[dict[str, float]]] = {n.label: [] for n in nodes}
    for r in range(args.rounds):
        order = list(range(len(nodes)))
        for i in order if r % 2 == 0 else order[::-1]:
            await drivers[i].window(0.3)  # settle after the other node's window
            with CpuMeter({"node": nodes[i].pid, "store": store_pid}) as meter:
                done, errors = await drivers[i].window(args.window)
            figures = meter.figures(done)
            run = {
                "writes_per_s": done / meter.wall,
                "node_ms": figures["cpu_ms_node"],
                "store_ms": figures["cpu_ms_store"],
                "ctxsw": figures["ctxsw_node"],
                "others_pct": figures["others_busy_pct"],
                "errors": float(errors),
            }
            runs[nodes[i].label].append(run)
            if args.verbose:
                print(
                    f"round {r} {nodes[i].label}: "
                    + " ".join(f"{k}={v:.2f}" for k, v in run.items())
                )
    for driver in drivers:
        for conn in driver.conns:
            conn.close()
    return runs


def report(runs: dict[str, list[dict[str, float]]]) -> None:
    """Medians per tree, and each tree's per-round ratio to the first."""
    first = next(iter(runs.values()))
    for tree, got in runs.items():
        med = {k: statistics.median(r[k] for r in got) for k in got[0]}
        line = (
            f"{tree}: {med['writes_per_s']:.0f} writes/s, node {med['node_ms']:.3f} ms CPU per "
            f"write, store {med['store_ms']:.3f} ms, {med['ctxsw']:.0f} context switches per "
            f"write ({len(got)} windows, others {med['others_pct']:.0f}% busy)"
        )
        if got is not first:
            ratios = [
                r["node_ms"] / b["node_ms"]
                for r, b in zip(got, first, strict=False)
                if b["node_ms"]
            ]
            line += (
                f"; node CPU {statistics.median(ratios):.3f}x the first tree's "
                f"(lower in {sum(x < 1 for x in ratios)} of {len(ratios)} rounds)"
            )
        print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trees", nargs="*", type=Path, default=[REPO])
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--cells", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--window", type=float, default=2.0, help="seconds per window")
    parser.add_argument("--verbose", action="store_true", help="print every window")
    args = parser.parse_args()
    store_environment()
    workdir = Path(tempfile.mkdtemp(prefix="cellactors-write-cpu-"))
    nodes: list[TreeNode] = []
    try:
        with SeaweedServer(workdir / "store", credentials=BENCH_KEYS) as store:
            assert store.proc is not None
            S3Bucket(
                BUCKET, "", endpoint=store.endpoint, access_key=ACCESS_KEY, secret_key=SECRET_KEY
            ).ensure_exists()
            for i, tree in enumerate(args.trees):
                nodes.append(TreeNode(tree.resolve(), i, workdir, store.endpoint).start())
            for node in nodes:
                node.ready()
            report(asyncio.run(compare(nodes, store.proc.pid, args)))
    finally:
        for node in nodes:
            node.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
