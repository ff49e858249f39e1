"""``python -m bench --peer restate``: cellactors side by side with Restate, the peer a user
would pick instead, on the example counter (a Restate keyed virtual object doing the same).

cellactors runs as a ``cellactors serve`` node on an embedded SeaweedFS; Restate as its
server (from npm) and a Python SDK service (from PyPI), installed once into a cache
directory (see :mod:`bench.peer_restate_install`). The same load generator drives both,
alternating which goes first, for every workload of :mod:`bench.peer_workloads`; each
figure is the median of the runs and the ratio is cellactors / Restate. At the end every
counter is read back on both sides and compared with the acknowledged adds.

When the peer cannot be installed or started, it says why and exits 0 (a skip).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from bench.common import BENCH_KEYS, Env, Sizes, medians, store_environment
from bench.peer_restate_install import (
    SDK_VERSION,
    SERVER_VERSION,
    PeerUnavailable,
    RestateInstall,
    install,
)
from bench.peer_restate_procs import RestatePeer
from bench.peer_workloads import WORKLOADS, Figures, PeerSizes, Side, growth, touch
from bench.procs import NodeProc
from bench.suite import _git_commit, _loadavg, log

SIDES = ("cellactors", "Restate")
# (label, workload, figure, format): one line of the table each.
LINES = (
    ("1. one key, sequential: p50 latency", "lone", "p50_ms", "{:.2f} ms"),
    ("2. one key, {clients} clients: acks/s", "hot", "acks_per_s", "{:.0f}"),
    ("3. {keys} keys, {clients} clients: acks/s", "spread", "acks_per_s", "{:.0f}"),
    ("3. server CPU per ack", "spread", "cpu_ms_per_ack", "{:.2f} ms"),
    ("4. first call to a new key: p50", "first", "p50_ms", "{:.2f} ms"),
    ("4. server CPU per first call", "first", "cpu_ms_per_call", "{:.2f} ms"),
)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench --peer restate", description=__doc__)
    parser.add_argument("--peer", choices=["restate"], required=True)
    parser.add_argument("--quick", action="store_true", help="one run, smaller sizes")
    parser.add_argument("--runs", type=int, help="runs per figure (the median is reported)")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply counts and windows")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write the results here")
    parser.add_argument("--workdir", type=Path, help="keep store, logs and databases here")
    parser.add_argument(
        "--peer-cache",
        type=Path,
        metavar="DIR",
        help="install the peer under DIR/restate (default $CELLACTORS_BENCH_CACHE, else "
        "~/.cache/cellactors-bench)",
    )
    return parser.parse_args(argv)


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    sizes = (Sizes.quick() if args.quick else Sizes()).scaled(args.scale)
    if args.runs:
        sizes = replace(sizes, runs=args.runs)
    peer_sizes = PeerSizes.of(sizes)
    meta: dict[str, Any] = {
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": _git_commit(),
        "cpus": os.cpu_count(),
        "loadavg_start": _loadavg(),
        "restate_server": SERVER_VERSION,
        "restate_sdk": SDK_VERSION,
        "sizes": asdict(peer_sizes),
    }
    try:
        log(f"installing Restate {SERVER_VERSION} and restate-sdk {SDK_VERSION} (cached) ...")
        restate = install(args.peer_cache)
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="cellactors-peer-") as tmp:
            workdir = args.workdir or Path(tmp)
            workdir.mkdir(parents=True, exist_ok=True)
            runs, sides, problems = run_both(restate, sizes, workdir)
    except PeerUnavailable as exc:
        print(f"SKIPPED --peer restate: {exc}", flush=True)
        sys.exit(0)
    meta["duration_s"] = round(time.monotonic() - t0, 1)
    meta["loadavg_end"] = _loadavg()
    report(meta, runs, peer_sizes, sides, problems)
    if args.json:
        payload = {"meta": meta, "runs": runs, "problems": problems}
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
    sys.exit(1 if problems else 0)


def run_both(
    restate: RestateInstall, sizes: Sizes, workdir: Path
) -> tuple[dict[str, dict[str, list[Figures]]], list[Side], list[str]]:
    """Start both systems in ``workdir``, measure them and check their counters: the runs'
    figures, the sides and what the check found. :class:`PeerUnavailable` when Restate
    does not start."""
    store_environment()
    from cellactors.persistence.store.embedded import SeaweedServer

    with SeaweedServer(workdir / "store", credentials=BENCH_KEYS) as store:
        env = Env(store, workdir, sizes, log=log)
        env.bucket("").ensure_exists()
        node = NodeProc("peer", workdir / "cellactors", env.spec("peer"), env.endpoint)
        node.start()
        try:
            peer = RestatePeer.start(restate, workdir / "restate")
            try:
                node.ready()
                assert store.proc is not None
                sides = [
                    Side(
                        "cellactors",
                        node.url,
                        "/cells/Counter",
                        {"node": node.pid, "store": store.proc.pid},
                        _call_result,
                    ),
                    Side("Restate", peer.url, "/Counter", peer.pids, int),
                ]
                runs = measure(sides, PeerSizes.of(sizes))
                return runs, sides, [p for side in sides for p in side.check()]
            finally:
                peer.stop()
        finally:
            node.stop()


def _call_result(answer: Any) -> int:
    """The count in a cellactors answer, ``{"result": n}``."""
    return int(answer["result"])


def measure(sides: list[Side], s: PeerSizes) -> dict[str, dict[str, list[Figures]]]:
    """Every workload ``s.runs`` times on every side, alternating which side goes first;
    the figures of each run by workload and side."""
    runs: dict[str, dict[str, list[Figures]]] = {}
    for run in range(s.runs):
        order = sides if run % 2 == 0 else sides[::-1]
        for workload in WORKLOADS:
            for side in order:
                log(f"run {run + 1}/{s.runs}: {workload.__name__} on {side.name} ...")
                figures = workload(side, s, run)
                runs.setdefault(workload.__name__, {}).setdefault(side.name, []).append(figures)
        log(f"run {run + 1}/{s.runs}: touching {s.touched} new keys, RSS 35 s later ...")
        touches = [touch(side, s, run) for side in order]
        for done in touches:
            runs.setdefault("rss", {}).setdefault(done.side.name, []).append(growth(done))
    return runs


def table(runs: dict[str, dict[str, list[Figures]]], s: PeerSizes) -> list[list[str]]:
    """The lines of the table: label, cellactors, Restate, ratio (cellactors / Restate)."""
    lines = []
    for label, workload, key, fmt in LINES:
        values = [medians(runs[workload][side])[key] for side in SIDES]
        ratio = values[0] / values[1] if values[1] else float("nan")
        lines.append([label.format(**asdict(s)), *(fmt.format(v) for v in values), f"{ratio:.2f}x"])
    rss = {side: medians(runs["rss"][side]) for side in SIDES}
    ours, theirs = rss["cellactors"], rss["Restate"]
    total_ours = ours["rss_kib_node"] + ours["rss_kib_store"]
    total_theirs = theirs["rss_kib_server"] + theirs["rss_kib_service"]
    lines.append(
        [
            "5. RSS growth per key touched, 35 s later",
            f"{total_ours:.1f} KiB (node {ours['rss_kib_node']:.1f}, "
            f"store {ours['rss_kib_store']:.1f})",
            f"{total_theirs:.1f} KiB (server {theirs['rss_kib_server']:.1f}, "
            f"service {theirs['rss_kib_service']:.1f})",
            f"{total_ours / total_theirs:.2f}x" if total_ours > 0 < total_theirs else "-",
        ]
    )
    return lines


def report(
    meta: dict[str, Any],
    runs: dict[str, dict[str, list[Figures]]],
    s: PeerSizes,
    sides: list[Side],
    problems: list[str],
) -> None:
    """Print the table, how it was run, and the check of every acknowledged add."""
    print()
    print(
        f"cellactors vs Restate {meta['restate_server']} (restate-sdk {meta['restate_sdk']}), "
        f"commit {meta['commit']}: median of {s.runs} run(s); {meta['cpus']} CPUs, load "
        f"average {meta['loadavg_start'][:1]} at start, {meta['loadavg_end'][:1]} at end; "
        f"{meta['duration_s']:.0f} s"
    )
    print()
    header = ["workload", "cellactors", "Restate", "ratio"]
    lines = [header, ["---"] * len(header), *table(runs, s)]
    print("\n".join("| " + " | ".join(cells) + " |" for cells in lines))
    print()
    for side in sides:
        acked = sum(side.acked.values())
        print(
            f"- {side.name}: {acked} acknowledged adds on {len(side.acked)} keys, "
            f"{side.unacked} calls answered with an error"
        )
    if problems:
        print("\nFAILURE: acknowledged adds not counted exactly once:")
        for problem in problems:
            print(f"  {problem}")
    else:
        print("- every acknowledged add is counted exactly once on both sides")
