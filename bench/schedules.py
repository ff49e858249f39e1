"""``python -m bench.schedules``: what named schedules cost, on an in-memory store whose
requests the node meters (so request counts are exact and times are the runtime's own, with
no store latency in them).

Prints, for a call that sets ``n`` schedules (one-shot or cron) on a fresh cell (its first
use of the table: a schema change, so its batch carries an image): the bucket requests it
sent and its time, with the ratio of its wake-entry requests to those of a call setting
one; and the time of one due-time computation (``every``, and cron in a time zone). Not
part of the suite: no goal, numbers only (docs/writing-a-cell.md, "Schedules")."""

from __future__ import annotations

import argparse
import statistics
import time
import timeit
from collections import Counter

from cellactors import CellActor, Node, NodeSettings
from cellactors.core.schedules import Spec, cron_next, next_due
from cellactors.persistence.store.memory import MemoryBucket

EPOCH_MS = 1_790_000_000_000


class Bulk(CellActor):
    """Sets ``n`` schedules in one call."""

    def many(self, n: int, kind: str) -> None:
        for i in range(n):
            if kind == "cron":
                self.schedule(f"c{i}", cron=f"{i % 60} 9 * * MON", tz="Europe/Paris")
            else:
                self.schedule(f"a{i}", after=600 + i)

    def touch(self) -> None:
        self.db.execute("CREATE TABLE IF NOT EXISTS t (x)")


def wake_requests(sent: dict[tuple[str, str], int]) -> int:
    return sum(v for (_op, kind), v in sent.items() if kind == "wake")


def measure(node: Node, cell: str, n: int, kind: str) -> tuple[dict[tuple[str, str], int], float]:
    ref = node.cell(Bulk, cell)
    ref.touch()  # activated first: the measured call is the schedules' alone
    before: Counter[tuple[str, str]] = node.bucket.snapshot()
    started = time.perf_counter()
    ref.many(n=n, kind=kind)
    elapsed = time.perf_counter() - started
    after = node.bucket.snapshot()
    sent = {k: after[k] - before[k] for k in after if after[k] != before[k] and k[1] != "lease"}
    return sent, elapsed


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.schedules", description=__doc__)
    parser.add_argument("--counts", default="1,20,100,1000", help="schedules per call")
    parser.add_argument("--runs", type=int, default=3, help="runs per figure (median)")
    args = parser.parse_args(argv)
    counts = [int(c) for c in args.counts.split(",")]
    settings = NodeSettings(alarm_scan_interval=3600, advertise="127.0.0.1:19")
    node = Node(MemoryBucket(), "bench", [Bulk], settings).start()
    try:
        print("schedules per call | kind | requests (wake) | wake vs one | call ms (median)")
        for kind in ("at", "cron"):
            base: int | None = None
            for n in counts:
                times: list[float] = []
                sent: dict[tuple[str, str], int] = {}
                for run in range(args.runs):
                    sent, elapsed = measure(node, f"{kind}-{n}-{run}", n, kind)
                    times.append(elapsed * 1000)
                wakes = wake_requests(sent)
                base = wakes if base is None else base
                ratio = wakes / base if base else float("nan")
                total = sum(sent.values())
                print(
                    f"{n:18d} | {kind:4s} | {total:8d} ({wakes}) | {ratio:11.2f} | "
                    f"{statistics.median(times):8.1f}"
                )
    finally:
        node.stop()
    loops = 2000
    cron_s = timeit.timeit(lambda: cron_next("0 9 * * MON", "Europe/Paris", EPOCH_MS), number=loops)
    spec = Spec("every", every_ms=60_000, anchor_ms=0)
    every_s = timeit.timeit(lambda: next_due(spec, EPOCH_MS, EPOCH_MS + 500), number=loops)
    print(
        f"next due time: cron (Europe/Paris) {cron_s / loops * 1e6:.0f} us, "
        f"every {every_s / loops * 1e6:.2f} us, ratio {cron_s / every_s:.0f}x"
    )


if __name__ == "__main__":
    main()
