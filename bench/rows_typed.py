"""Row 14: what checking a method's annotations costs a warm call, in process.

The example ``Counter`` is annotated (``increment(name: str, by: int = 1) -> int``), so its
calls are validated and converted by pydantic; ``PlainCounter`` is the same code without
annotations, which validation skips. Both run on one node, their runs alternating (plain
first on even runs, typed first on odd ones), so drift in the machine or the store falls on
both. The goal: validation adds at most 10% to a warm call's p50.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

from bench.common import Env, Goal, Row, make_row, ms, percentile
from cellactors import read_only
from examples.counter import Counter

PREFIX = "typed"


class PlainCounter(Counter):
    """The example Counter with its annotations removed: calls that validation skips."""

    def increment(self, name, by=1):  # type: ignore[no-untyped-def]
        return super().increment(name, by)

    @read_only
    def get(self, name):  # type: ignore[no-untyped-def]
        return super().get(name)


def _p50_ms(call: Callable[[], Any], n: int) -> float:
    lat = []
    for _ in range(n):
        t = time.perf_counter()
        call()
        lat.append(time.perf_counter() - t)
    return ms(percentile(lat, 0.5))


def row14(env: Env) -> list[Row]:
    """Warm write and warm read p50, annotated vs not, alternating runs."""
    node = env.node(PREFIX, "typed", classes=[Counter, PlainCounter])
    try:
        cells = {"typed": node.cell(Counter, "t"), "plain": node.cell(PlainCounter, "t")}
        for cell in cells.values():  # activate and warm both
            cell.increment("x")
            cell.get("x")
        writes, reads = env.sizes.lone_writes, env.sizes.reads
        runs: list[dict[str, float]] = []
        for i in range(env.sizes.runs):
            order = ("plain", "typed") if i % 2 == 0 else ("typed", "plain")
            run: dict[str, float] = {}
            for kind in order:
                write, read = (
                    functools.partial(f, "x") for f in (cells[kind].increment, cells[kind].get)
                )
                run[f"{kind}_write_p50_ms"] = _p50_ms(write, writes)
                run[f"{kind}_read_p50_ms"] = _p50_ms(read, reads)
            for op in ("write", "read"):
                run[f"{op}_ratio"] = run[f"typed_{op}_p50_ms"] / run[f"plain_{op}_p50_ms"]
                run[f"{op}_added_us"] = 1000 * (
                    run[f"typed_{op}_p50_ms"] - run[f"plain_{op}_p50_ms"]
                )
            runs.append(run)
    finally:
        node.stop()
    goal = Goal("<=", 1.1, "<= 1.1x")
    return [
        make_row(
            f"14-typed-{op}",
            f"warm {op} p50 with checked annotations, in process",
            runs,
            metric=f"{op}_ratio",
            metric_fmt="{:.2f}x",
            goal=goal,
            figure=f"p50 {{typed_{op}_p50_ms:.3f}} ms (+{{{op}_added_us:.0f}} us)",
            baseline=f"unannotated p50 {{plain_{op}_p50_ms:.3f}} ms",
        )
        for op in ("write", "read")
    ]
