"""Rows 9-11: bucket requests of an idle node (measured beside the other rows), and failover
after SIGKILL of a ``cellactors serve`` owner, with a short history and a long one."""

from __future__ import annotations

import threading
import time
from collections import Counter as Tally
from collections.abc import Callable

import httpx

from bench.common import Env, Goal, Row, make_row, run_parallel
from bench.procs import NodeProc
from examples.counter import Counter

NODE_HEADER = "X-Cellactors-Node"


# --------------------------------------------------------------------------- row 9


class IdleProbe:
    """An in-process node with resident idle cells (default settings: TTL 10 s, idle
    timeout 300 s) whose metered bucket requests are sampled in the background while the
    other rows run: they do not touch it, and its own requests do not depend on them."""

    def __init__(self, env: Env) -> None:
        self.env = env
        self.node = env.node("idle", "idle")
        cells = env.sizes.idle_cells
        run_parallel([self._touch(f"i{i}") for i in range(cells)], 16)
        time.sleep(1.0)  # let the activations' last requests land
        self.samples: list[tuple[float, Tally[tuple[str, str]]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="idle-probe", daemon=True)
        self._thread.start()

    def _touch(self, name: str) -> Callable[[], object]:
        return lambda: self.node.cell(Counter, name).get("x")

    def _sample(self) -> None:
        while True:
            self.samples.append((time.monotonic(), self.node.bucket.snapshot()))
            if self._stop.wait(0.25):
                self.samples.append((time.monotonic(), self.node.bucket.snapshot()))
                return

    def finish(self) -> list[Row]:
        """Wait for the shortest window, stop, and report the rate over ``runs`` equal parts
        of the window (each a run)."""
        sizes = self.env.sizes
        start = self.samples[0][0]
        remaining = sizes.idle_window - (time.monotonic() - start)
        if remaining > 0:
            self.env.log(f"  row 9: waiting {remaining:.0f} s more of idle window")
            time.sleep(remaining)
        self._stop.set()
        self._thread.join()
        resident = self.node.resident_cells()
        self.node.stop()
        end = self.samples[-1][0]
        part = (end - start) / sizes.runs
        runs = []
        for i in range(sizes.runs):
            a = self._at(start + i * part)
            b = self._at(start + (i + 1) * part)
            total = sum(b[1].values()) - sum(a[1].values())
            runs.append({"requests_per_s": total / (b[0] - a[0]), "window_s": b[0] - a[0]})
        first, last = self.samples[0][1], self.samples[-1][1]
        kinds = ", ".join(
            f"{op} {kind} {last[(op, kind)] - first.get((op, kind), 0)}"
            for op, kind in sorted(last)
            if last[(op, kind)] - first.get((op, kind), 0)
        )
        return [
            make_row(
                "9-idle-requests",
                f"idle node ({resident} resident cells) bucket requests per second",
                runs,
                metric="requests_per_s",
                metric_fmt="{:.2f}/s",
                goal=Goal("<=", 0.35, "<= 0.35/s"),
                figure="{requests_per_s:.2f}/s over {window_s:.0f} s windows",
                note=f"whole window {end - start:.0f} s: {kinds or 'no requests'}",
            )
        ]

    def _at(self, t: float) -> tuple[float, Tally[tuple[str, str]]]:
        """The sample nearest to time ``t``."""
        return min(self.samples, key=lambda s: abs(s[0] - t))

    def abandon(self) -> None:
        """Stop without a report (the suite failed)."""
        self._stop.set()
        self.node.stop()


# --------------------------------------------------------------------------- rows 10-11


def row10(env: Env) -> list[Row]:
    """SIGKILL the owner of a cell; time until another node acknowledges a write to it."""
    ttl = env.sizes.failover_ttl
    return _failover_row(
        "10-failover",
        f"failover after SIGKILL of the owner (TTL {ttl:g} s)",
        _failovers(env, "fleet", history=1),
        ttl,
        "{failover_s:.2f} s to the first ack on another node ({attempts:.0f} tries)",
    )


def row11(env: Env) -> list[Row]:
    """Row 10 for a cell whose history since its last snapshot is long: the new owner
    restores every batch of it before it can acknowledge."""
    ttl = env.sizes.failover_ttl
    history = env.sizes.history
    return _failover_row(
        "11-failover-history",
        f"failover after SIGKILL, a cell with {history} unsnapshotted batches (TTL {ttl:g} s)",
        _failovers(env, "fleet-history", history=history),
        ttl,
        "{failover_s:.2f} s to the first ack on another node, which read "
        "{batches_read:.0f} batches ({attempts:.0f} tries)",
    )


def _failover_row(
    row_id: str, title: str, runs: list[dict[str, float]], ttl: float, figure: str
) -> list[Row]:
    """A failover row: the time to the first acknowledgement, held to TTL + 1 s."""
    return [
        make_row(
            row_id,
            title,
            runs,
            metric="failover_s",
            metric_fmt="{:.2f} s",
            goal=Goal("<=", ttl + 1, f"<= {ttl + 1:g} s"),
            figure=figure,
        )
    ]


def _failovers(env: Env, tag: str, history: int) -> list[dict[str, float]]:
    """One run per victim node: a cell gets ``history`` acknowledged writes, one batch each
    (the last through the survivor, forwarded to the owner, as a client of the fleet would
    send it), the owner is SIGKILLed, and the writer retries through the survivor every
    10 ms. Each run's figures; an answer that shows an acknowledged write lost fails it."""
    sizes = env.sizes
    ttl = sizes.failover_ttl
    spec = env.spec(tag)
    workdir = env.workdir / tag
    survivor = NodeProc("survivor", workdir, spec, env.endpoint, lease_ttl=ttl)
    victims = [
        NodeProc(f"victim-{i}", workdir, spec, env.endpoint, lease_ttl=ttl)
        for i in range(sizes.runs)
    ]
    procs = [survivor, *victims]
    direct = max(1, history - 1)  # written to the owner, then one more through the survivor
    try:
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.ready()
        runs = []
        with httpx.Client(timeout=httpx.Timeout(10.0, connect=1.0)) as client:
            for i, victim in enumerate(victims):
                path = f"/cells/Counter/f{i}/increment"
                for _ in range(direct):
                    owner = client.post(victim.url + path, json={"name": "x"})
                    owner.raise_for_status()
                assert owner.headers[NODE_HEADER] == victim.name, owner.headers
                via = client.post(survivor.url + path, json={"name": "x"})
                via.raise_for_status()
                assert via.headers[NODE_HEADER] == victim.name, "not forwarded to the owner"
                before = survivor.bucket_counts().get(("get", "batch"), 0)
                killed = time.monotonic()
                victim.kill()
                attempts = 0
                while True:
                    attempts += 1
                    try:
                        resp = client.post(survivor.url + path, json={"name": "x"})
                    except httpx.HTTPError:
                        resp = None
                    if resp is not None and resp.status_code == 200:
                        break
                    if time.monotonic() - killed > 10 * ttl + 30:
                        raise RuntimeError(f"no acknowledged write after killing {victim.name}")
                    time.sleep(0.01)
                took = time.monotonic() - killed
                value = int(resp.json()["result"])
                if value < direct + 2:  # the history, and this write
                    raise RuntimeError(f"acknowledged writes lost: {value} < {direct + 2}")
                runs.append(
                    {
                        "failover_s": took,
                        "attempts": attempts,
                        "batches_read": survivor.bucket_counts().get(("get", "batch"), 0) - before,
                        "answered_by_survivor": float(resp.headers[NODE_HEADER] == "survivor"),
                    }
                )
    finally:
        for proc in procs:
            proc.kill()
    return runs
