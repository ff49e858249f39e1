"""``python -m bench``: start an embedded SeaweedFS, measure every row with its baseline in
the same run (each figure the median of ``--runs`` runs), print a table of figures and
ratios to the goals, and write JSON with ``--json``.

Rows (goal): 1 lone write ack p50 vs bare PUT+GET (<= 1.2x in process, <= 1.3x over HTTP);
2 one cell, 64 writers: writes per PUT+GET time (>= 25 / >= 20); 3 64 and 256 cells written
concurrently vs bare PUT+GET pairs/s (>= 0.9x); 4 warm reads over HTTP vs a bare endpoint
(p50 <= 1.5x on 1 connection, >= 0.6x requests/s on 16); 5 idle cells per 2 GiB RSS
(>= 10,000); 6 activations/s (>= 200); 7 cold restore of a 1,000-batch chain (<= 0.5 s);
8 a snapshot bounds the third restore; 9 idle node requests/s (<= 0.35); 10 failover after
SIGKILL, TTL 3 s (<= 4 s); 13 lone write p50 on an embedded store that syncs each object vs
one that does not (<= 2x); 14 a warm write and read with checked annotations vs without
(<= 1.1x); 15 WebSockets: memory per idle socket vs a bare echo app (<= 1.3x), a
message round trip vs an HTTP call doing the same insert (<= 1.3x), a broadcast to 1,000
sockets until the last has it (p50 <= 50 ms); 16 RSS growth per touched cell 35 s after the
touch on a `serve` node with its embedded store (node <= 32 KiB); 17 a store 20 ms (PUT) and
10 ms (GET) away: one cell, 64 writers (>= 1,500/s, ack p50 <= 1.3x a PUT+GET), 256 cells by
64 clients vs PUT+GET pairs/s (>= 0.9x). See docs/performance.md.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import logging
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import BENCH_KEYS, REPO, Env, Row, Sizes, store_environment

GROUPS = tuple(range(1, 18))


def row_ids(sizes: Sizes) -> list[str]:
    """Every row the suite reports for ``sizes``, in order (the smoke test checks them)."""
    ids = ["1-inproc", "1-http", "2-inproc", "2-http"]
    ids += [f"3-{mode}-{c}" for c in sizes.distinct for mode in ("inproc", "http")]
    ids += ["4-read-1conn", "4-read-16conn", "5-resident", "5-hibernated", "5-wake"]
    ids += ["6-activations"]
    ids += ["7-cold-restore", "8-snapshot", "9-idle-requests", "10-failover"]
    ids += ["11-failover-history", "12-lease-under-load", "13-store-sync"]
    ids += ["14-typed-write", "14-typed-read"]
    ids += ["15-socket-density", "15-socket-roundtrip", "15-socket-broadcast"]
    ids += ["16-touched-memory"]
    return [*ids, "17-far-hot-rate", "17-far-hot-p50", "17-far-cells"]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="one run each, smaller sizes (~1 min)")
    parser.add_argument("--runs", type=int, help="runs per figure (the median is reported)")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply counts and windows")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write the results here")
    parser.add_argument(
        "--only",
        metavar="ROWS",
        help="comma-separated row numbers to run (e.g. 1,2,7); default all",
    )
    parser.add_argument("--workdir", type=Path, help="keep store, logs and databases here")
    return parser.parse_args(argv)


def _git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=False,
            timeout=5,
        )
        return out.stdout.strip()
    except OSError:
        return ""


def _loadavg() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run_suite(env: Env, groups: set[int]) -> tuple[list[Row], list[str]]:
    """Run the selected row groups; (rows, errors). A failing group is reported, not fatal."""
    from bench import (
        rows_calls,
        rows_cells,
        rows_far,
        rows_fleet,
        rows_memory,
        rows_sockets,
        rows_store,
        rows_typed,
    )
    from bench.procs import NodeProc

    rows: list[Row] = []
    errors: list[str] = []

    def group(name: str, fn: Callable[[], list[Row]]) -> None:
        log(f"{name} ...")
        t = time.monotonic()
        try:
            got = fn()
        except Exception:
            errors.append(f"{name}: {traceback.format_exc()}")
            log(f"{name} FAILED:\n{traceback.format_exc()}")
            return
        rows.extend(got)
        for row in got:
            log(f"  {row.id}: {row.figure} | {row.metric_text} (goal {row.goal.text})")
        log(f"{name} took {time.monotonic() - t:.1f} s")

    server: NodeProc | None = None
    if groups & {1, 2, 3, 4, 12}:
        # The HTTP node of rows 1-4 and 12 starts while the rest gets ready.
        server = NodeProc("http", env.workdir / "http", env.spec("calls-http"), env.endpoint)
        server.start()
    idle: rows_fleet.IdleProbe | None = None
    try:
        if 9 in groups:
            idle = rows_fleet.IdleProbe(env)
        if server is not None:
            calls = rows_calls.Calls.start(env, server)
            try:
                for number, fn in (
                    (1, rows_calls.row1),
                    (2, rows_calls.row2),
                    (3, rows_calls.row3),
                    (4, rows_calls.row4),
                    (12, rows_calls.row12),  # last: a node that fenced itself is gone
                ):
                    if number in groups:
                        group(f"row {number}", functools.partial(fn, calls))
            finally:
                calls.stop()
                server.stop()
                server = None
        for number, env_fn in (
            (5, rows_cells.row5),
            (6, rows_cells.row6),
            (7, rows_cells.row7),
            (8, rows_cells.row8),
            (10, rows_fleet.row10),
            (11, rows_fleet.row11),
            (13, rows_store.row13),
            (14, rows_typed.row14),
            (15, rows_sockets.row15),
            (16, rows_memory.row16),
            (17, rows_far.row17),
        ):
            if number in groups:
                group(f"row {number}", functools.partial(env_fn, env))
        if idle is not None:
            probe = idle
            idle = None
            group("row 9", probe.finish)
    finally:
        if idle is not None:
            idle.abandon()
        if server is not None:
            server.kill()
    order = {rid: i for i, rid in enumerate(row_ids(env.sizes))}
    rows.sort(key=lambda r: order.get(r.id, len(order)))
    return rows, errors


def format_table(rows: list[Row]) -> str:
    """The results as a Markdown table."""
    header = ["row", "what", "measured", "baseline", "result", "goal", "met"]
    lines = [header, ["---"] * len(header)]
    for r in rows:
        lines.append(
            [
                r.id,
                r.title,
                r.figure,
                r.baseline or "-",
                r.metric_text,
                r.goal.text,
                "yes" if r.met else "**no**",
            ]
        )
    return "\n".join("| " + " | ".join(cells) + " |" for cells in lines)


def format_cpu_table(rows: list[Row]) -> str:
    """Where the time went: CPU milliseconds per operation by process for the row and its
    baseline; for the process doing the work (the node over HTTP, else this one) the
    context switches per operation and the system share of its CPU; how busy the machine
    was (all CPUs) and how much of that was other processes."""
    header = ["row", "bench", "node", "store", "baseline: bench", "node", "store"]
    header += ["ctx sw/op", "baseline", "sys", "busy", "others"]
    lines = [header, ["---"] * len(header)]
    keys = ["cpu_ms_bench", "cpu_ms_node", "cpu_ms_store"]
    keys += [f"baseline_{k}" for k in keys]
    for r in rows:
        v = r.values
        if "cpu_ms_bench" not in v:
            continue
        cpu = [f"{v[k]:.2f}" if k in v else "-" for k in keys]
        worker = "node" if "cpu_ms_node" in v else "bench"
        base = "node" if "baseline_cpu_ms_node" in v else "bench"
        switches = [
            f"{v[f'ctxsw_{worker}']:.0f}",
            f"{v[f'baseline_ctxsw_{base}']:.0f}" if f"baseline_ctxsw_{base}" in v else "-",
            f"{v[f'sys_pct_{worker}']:.0f}%",
        ]
        busy = [f"{v['machine_busy_pct']:.0f}%", f"{v['others_busy_pct']:.0f}%"]
        lines.append([r.id, *cpu, *switches, *busy])
    return "\n".join("| " + " | ".join(cells) + " |" for cells in lines)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    sizes = Sizes.quick() if args.quick else Sizes()
    sizes = sizes.scaled(args.scale)
    if args.runs:
        from dataclasses import replace

        sizes = replace(sizes, runs=args.runs)
    groups = set(GROUPS) if not args.only else {int(x) for x in args.only.split(",") if x}
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    store_environment()
    from cellactors.persistence.store.embedded import SeaweedServer

    started_at = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    load_start = _loadavg()
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="cellactors-bench-") as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        with SeaweedServer(workdir / "store", credentials=BENCH_KEYS) as store:
            env = Env(store, workdir, sizes, log=log)
            env.bucket("").ensure_exists()
            rows, errors = run_suite(env, groups)
    duration = time.monotonic() - t0
    load_end = _loadavg()
    meta: dict[str, Any] = {
        "started": started_at,
        "duration_s": round(duration, 1),
        "quick": args.quick,
        "scale": args.scale,
        "groups": sorted(groups),
        "sizes": sizes.as_dict(),
        "commit": _git_commit(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "loadavg_start": load_start,
        "loadavg_end": load_end,
    }
    print()
    print(
        f"cellactors bench, commit {meta['commit']}: median of {sizes.runs} run(s) per figure; "
        f"{meta['cpus']} CPUs, load average {load_start[:1]} at start, {load_end[:1]} at end; "
        f"{duration:.0f} s"
    )
    print()
    print(format_table(rows))
    for row in rows:
        if row.note:
            print(f"- {row.id}: {row.note}")
    print()
    print(
        "Where the time went, per operation (write, read, activation, batch GET): CPU ms by "
        "process, context switches and system share of the working process, machine load:"
    )
    print()
    print(format_cpu_table(rows))
    if errors:
        print(f"\n{len(errors)} row group(s) failed; see above")
    if args.json:
        payload = {"meta": meta, "rows": [r.as_dict() for r in rows], "errors": errors}
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
    sys.exit(1 if errors else 0)
