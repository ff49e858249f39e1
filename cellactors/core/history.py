"""A node's short history of its own figures, for the inspector's charts (pure rules).

A :class:`Tally` is what the node's counters say at one instant (cumulative). The
:class:`Ring` keeps the last tallies, one per step; :func:`points` turns each pair of
neighbours into one interval: calls, errors and bucket requests counted in it, and the
latency histograms' counts in it, from which rates and percentiles follow
(:func:`derive`). Intervals of several nodes that end in the same step add up
(:func:`merge`), which is how the fleet's figures are made.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

#: Seconds between two samples, and how many intervals are kept (10 minutes).
STEP_S = 5.0
KEPT = 120
#: The percentiles shown, as (name suffix, quantile).
QUANTILES = (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))


@dataclass(frozen=True)
class Tally:
    """Cumulative counts at one instant: calls (all outcomes), calls not answered ok,
    bucket requests, and the cumulative counts of the call and acknowledgement latency
    histograms, one per upper bound (the last is +Inf)."""

    t_ms: int
    calls: int
    errors: int
    bucket: int
    call_hist: tuple[int, ...]
    ack_hist: tuple[int, ...]


class Ring:
    """The last ``kept + 1`` tallies (``kept`` intervals), oldest first."""

    def __init__(self, kept: int = KEPT) -> None:
        self._tallies: deque[Tally] = deque(maxlen=kept + 1)

    def add(self, tally: Tally) -> bool:
        """Keep ``tally`` unless it is not later than the last one (time only moves on in a
        history); whether it was kept."""
        if self._tallies and tally.t_ms <= self._tallies[-1].t_ms:
            return False
        self._tallies.append(tally)
        return True

    def tallies(self) -> list[Tally]:
        return list(self._tallies)

    def __len__(self) -> int:
        return len(self._tallies)


def step_end(t_ms: int, step_s: float = STEP_S) -> int:
    """The end of the step ``t_ms`` falls in: the time stamp nodes agree on."""
    step_ms = int(step_s * 1000)
    return (t_ms // step_ms + 1) * step_ms


def _delta(now: int, before: int) -> int:
    # A counter below its previous value was reset (a new registry): count from zero.
    return now if now < before else now - before


def _hist_delta(now: Sequence[int], before: Sequence[int]) -> list[int]:
    """Per-bucket (not cumulative) counts between two cumulative histograms."""
    if len(now) != len(before) or any(n < b for n, b in zip(now, before, strict=True)):
        before = [0] * len(now)
    cumulative = [n - b for n, b in zip(now, before, strict=True)]
    return [c - (cumulative[i - 1] if i else 0) for i, c in enumerate(cumulative)]


def quantile(bounds_s: Sequence[float], counts: Sequence[int], q: float) -> float | None:
    """The ``q`` quantile in seconds of per-bucket ``counts`` (upper ``bounds_s``, then
    +Inf), interpolated linearly inside its bucket as Prometheus does; None without
    observations. A quantile in the +Inf bucket is the last finite bound."""
    total = sum(counts)
    if total == 0:
        return None
    rank = q * total
    seen = 0
    for i, count in enumerate(counts):
        if count and seen + count >= rank:
            if i >= len(bounds_s):
                return bounds_s[-1]
            lower = bounds_s[i - 1] if i else 0.0
            return lower + (bounds_s[i] - lower) * (rank - seen) / count
        seen += count
    return bounds_s[-1]


def points(tallies: Sequence[Tally]) -> list[dict[str, Any]]:
    """One interval per pair of neighbouring tallies: ``t_ms`` (its end), ``seconds``,
    counts of ``calls``, ``errors``, ``bucket`` and the per-bucket ``call_hist`` and
    ``ack_hist``."""
    out = []
    for before, now in itertools.pairwise(tallies):
        out.append(
            {
                "t_ms": now.t_ms,
                "seconds": max(0.001, (now.t_ms - before.t_ms) / 1000),
                "calls": _delta(now.calls, before.calls),
                "errors": _delta(now.errors, before.errors),
                "bucket": _delta(now.bucket, before.bucket),
                "call_hist": _hist_delta(now.call_hist, before.call_hist),
                "ack_hist": _hist_delta(now.ack_hist, before.ack_hist),
            }
        )
    return out


def derive(point: dict[str, Any], bounds_s: Sequence[float]) -> dict[str, Any]:
    """``point`` with its rates per second and latency percentiles in ms (None when no
    call or acknowledgement happened in it)."""
    seconds = point["seconds"]
    out = dict(point)
    out["calls_per_s"] = point["calls"] / seconds
    out["errors_per_s"] = point["errors"] / seconds
    out["bucket_per_s"] = point["bucket"] / seconds
    for prefix, hist in (("call", point["call_hist"]), ("ack", point["ack_hist"])):
        for name, q in QUANTILES:
            value = quantile(bounds_s, hist, q)
            out[f"{prefix}_{name}_ms"] = None if value is None else round(value * 1000, 3)
    return out


def merge(histories: Iterable[Sequence[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The fleet's intervals: those of every node ending in the same step, added up
    (rates follow from the sums, so a node with more calls weighs more in percentiles)."""
    slots: dict[int, dict[str, Any]] = {}
    for history in histories:
        for p in history:
            slot = slots.get(p["t_ms"])
            if slot is None:
                slots[p["t_ms"]] = {
                    k: list(v) if isinstance(v, list) else v for k, v in p.items()
                } | {"nodes": 1}
                continue
            slot["nodes"] += 1
            slot["seconds"] = max(slot["seconds"], p["seconds"])
            for key in ("calls", "errors", "bucket"):
                slot[key] += p[key]
            for key in ("call_hist", "ack_hist"):
                if len(slot[key]) == len(p[key]):
                    slot[key] = [a + b for a, b in zip(slot[key], p[key], strict=True)]
    return [slots[t] for t in sorted(slots)]
