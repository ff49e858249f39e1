"""Row group 15: WebSockets into cells, on ``cellactors serve`` nodes serving this module's
:class:`SocketBench` (``--app bench.rows_sockets``).

- ``15-socket-density``: idle sockets held by one node (10 per cell, the cells hibernated)
  against a bare Starlette echo app on uvicorn with the node's WebSocket implementation and
  settings (:mod:`bench.bare_app`) holding as many: RSS growth per socket, from before the
  sockets opened to after (both sides warmed first by a round of one socket per cell,
  opened and dropped). The sockets are held by :mod:`bench.socket_load`, a process of its
  own. Goal: <= 1.3x the echo's memory per socket.
- ``15-socket-roundtrip``: a frame sent, ``on_message`` inserts a row and answers with
  ``conn.send``, the answer received; against ``POST .../note`` doing the same insert, on
  the same node and cell, alternating in blocks. Goal: p50 <= 1.3x.
- ``15-socket-broadcast``: one cell with many sockets; one HTTP call makes it
  ``broadcast``; the time from sending that call to the last socket receiving the frame.
  Goal: p50 <= 50 ms.
"""

from __future__ import annotations

import asyncio
import json
import re
import statistics
import subprocess
import sys
import time
from typing import Any

import httpx

from bench.common import REPO, CpuMeter, Env, Goal, Row, make_row, ms, percentile, proc_status
from bench.procs import BareProc, NodeProc, ServerProc
from cellactors import CellActor
from cellactors.actors.sockets import Connection

APP = "bench.rows_sockets"
CLS = "SocketBench"
KIB = 1024.0


class SocketBench(CellActor):
    """A cell that notes what it is sent: by a socket (and answers on it) or by a call; and
    that broadcasts to every socket it has."""

    def on_activate(self) -> None:
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS notes (id INTEGER PRIMARY KEY, text TEXT NOT NULL)"
        )

    def on_connect(self, conn: Connection) -> None:
        pass

    def on_message(self, conn: Connection, data: str | bytes) -> None:
        conn.send(str(self._note(str(data))))

    def on_close(self, conn: Connection, code: int, reason: str) -> None:
        pass

    def note(self, text: str) -> int:
        """The insert of ``on_message``, as a call."""
        return self._note(text)

    def shout(self, text: str) -> int:
        """Broadcast ``text`` to every socket of the cell: how many it goes to."""
        return self.broadcast(text)

    def _note(self, text: str) -> int:
        cur = self.db.execute("INSERT INTO notes (text) VALUES (?)", [text])
        return int(cur.lastrowid or 0)


# --------------------------------------------------------------------------- helpers


def _node(env: Env, name: str, prefix: str) -> NodeProc:
    """A node serving :class:`SocketBench` whose cells hibernate after 1 s idle."""
    return NodeProc(
        name,
        env.workdir / "sockets",
        env.spec(prefix),
        env.endpoint,
        app=APP,
        extra=("--hibernate-after", "1", "--idle-timeout", "600"),
    )


def _gauges(node: NodeProc) -> dict[str, float]:
    text = httpx.get(node.internal_url + "/metrics", timeout=60).text
    return {
        m.group(1): float(m.group(2))
        for m in re.finditer(r"^(cellactors_\w+_cells) ([0-9.e+]+)$", text, re.M)
    }


def _wait_hibernated(node: NodeProc, cells: int, timeout: float = 120.0) -> float:
    """Wait until ``cells`` cells are hibernated and none is resident, twice in a row 0.5 s
    apart (a socket event would wake one); seconds waited."""
    start = time.monotonic()
    streak = 0
    while True:
        try:
            g = _gauges(node)
        except httpx.HTTPError:  # a node busy with thousands of sockets answers late
            g = {}
        if (
            g.get("cellactors_hibernated_cells", 0) >= cells
            and g.get("cellactors_resident_cells", 0) == 0
        ):
            streak += 1
            if streak == 2:
                return time.monotonic() - start
        else:
            streak = 0
        if time.monotonic() - start > timeout:
            raise RuntimeError(f"cells not hibernated in {timeout:g} s: {g}")
        time.sleep(0.5)


def _rss(pid: int, samples: int = 3) -> float:
    """The median of a few RSS readings of ``pid``, 0.2 s apart (bytes)."""
    values = []
    for i in range(samples):
        if i:
            time.sleep(0.2)
        values.append(proc_status(pid)["rss"])
    return float(statistics.median(values))


class Holder:
    """A :mod:`bench.socket_load` process holding sockets to ``server``."""

    def __init__(self, server: ServerProc, cells: int, per_cell: int, concurrency: int) -> None:
        url = "ws" + server.url[len("http") :]
        args = [sys.executable, "-m", "bench.socket_load", "--url", url, "--cls", CLS]
        args += ["--cells", str(cells), "--per-cell", str(per_cell)]
        args += ["--concurrency", str(concurrency)]
        self.log_path = server.workdir / f"load-{server.name}.log"
        with open(self.log_path, "ab") as err:
            self.proc = subprocess.Popen(
                args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, cwd=REPO
            )

    def opened(self, timeout: float = 300.0) -> dict[str, Any]:
        """Wait for the sockets to be open: ``{"opened", "failed", "seconds"}``."""
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # the generator's own timeouts bound this
        if not line:
            self.proc.wait(timeout)
            tail = self.log_path.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"socket load exited with {self.proc.returncode}: {tail}")
        return dict(json.loads(line))

    def release(self) -> None:
        """Let the sockets go (the process exits; the server sees them drop)."""
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            try:
                self.proc.stdin.write(b"\n")
                self.proc.stdin.close()
            except BrokenPipeError:
                pass
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _hold(
    server: ServerProc, cells: int, per_cell: int, settle: Any, concurrency: int = 100
) -> dict[str, float]:
    """Warm ``server`` with one socket per cell (opened, then dropped), then open
    ``per_cell`` per cell and hold them: RSS before and after (after ``settle()``)."""
    warm = Holder(server, cells, 1, concurrency)
    try:
        got = warm.opened()
    finally:
        warm.release()
    if got["failed"]:
        raise RuntimeError(f"{server.name}: {got['failed']} warm-up sockets failed")
    settle()
    before = proc_status(server.pid)
    rss_before = _rss(server.pid)
    holder = Holder(server, cells, per_cell, concurrency)
    try:
        got = holder.opened()
        if got["failed"]:
            raise RuntimeError(f"{server.name}: {got['failed']} sockets failed to open")
        settled = settle()
        after = proc_status(server.pid)
        rss_after = _rss(server.pid)
    finally:
        server.kill()  # before the sockets drop: nothing runs for them
        holder.release()
    opened = float(got["opened"])
    return {
        "sockets": opened,
        "open_s": float(got["seconds"]),
        "settle_s": float(settled or 0.0),
        "rss_before_mib": rss_before / (1 << 20),
        "rss_after_mib": rss_after / (1 << 20),
        "kib_per_socket": (rss_after - rss_before) / KIB / opened,
        "fds_per_socket": (after["fds"] - before["fds"]) / opened,
        "threads_added": float(after["threads"] - before["threads"]),
    }


# --------------------------------------------------------------------------- 15-socket-density


def density_run(env: Env, run: int) -> dict[str, float]:
    """One run of the density row: the node, then the bare echo, each fresh."""
    cells, per_cell = env.sizes.socket_cells, env.sizes.sockets_per_cell
    node = _node(env, f"density{run}", f"sockets-density{run}")
    node.start().ready()
    try:
        got = _hold(node, cells, per_cell, lambda: _wait_hibernated(node, cells))
    finally:
        node.kill()
    bare = BareProc(env.workdir / "sockets", b"{}")
    bare.start().ready()
    try:
        base = _hold(bare, cells, per_cell, lambda: time.sleep(2.0))
    finally:
        bare.kill()
    out = {f"node_{k}": v for k, v in got.items()}
    out.update({f"bare_{k}": v for k, v in base.items()})
    out["ratio"] = got["kib_per_socket"] / base["kib_per_socket"]
    out["node_mib"] = got["kib_per_socket"] * got["sockets"] / KIB
    out["bare_mib"] = base["kib_per_socket"] * base["sockets"] / KIB
    return out


def row15_density(env: Env) -> Row:
    runs = [density_run(env, i) for i in range(env.sizes.socket_density_runs)]
    sockets = env.sizes.socket_cells * env.sizes.sockets_per_cell
    return make_row(
        "15-socket-density",
        f"{sockets:,} idle sockets on one node over {env.sizes.socket_cells:,} hibernated "
        "cells: RSS growth per socket",
        runs,
        metric="ratio",
        metric_fmt="{:.2f}x",
        goal=Goal("<=", 1.3, "<= 1.3x"),
        figure="{node_kib_per_socket:.1f} KiB/socket (+{node_mib:.0f} MiB; "
        "opened in {node_open_s:.1f} s)",
        baseline="bare echo {bare_kib_per_socket:.1f} KiB/socket (+{bare_mib:.0f} MiB)",
    )


# --------------------------------------------------------------------------- 15-socket-roundtrip


async def _open_ws(base: str, cell: str) -> Any:
    from bench.socket_load import open_socket

    return await open_socket("ws" + base[len("http") :] + f"/cells/{CLS}/{cell}/ws")


async def _roundtrips(base: str, cell: str, n: int, runs: int) -> list[dict[str, float]]:
    """Per run: ``n`` socket round trips and ``n`` calls, alternating in blocks of 20."""
    from bench.http import _Conn, _request

    url = httpx.URL(base)
    host, port = url.host, url.port or 80
    request = _request(host, port, f"/cells/{CLS}/{cell}/note", b'{"text": "x"}')
    ws = await _open_ws(base, cell)
    conn = await _Conn.open(host, port)

    async def socket_trip() -> float:
        t = time.perf_counter()
        await ws.send("x")
        await ws.recv()
        return time.perf_counter() - t

    async def http_trip() -> float:
        t = time.perf_counter()
        status = await conn.post(request)
        if status != 200:
            raise RuntimeError(f"note answered {status}")
        return time.perf_counter() - t

    try:
        for _ in range(20):  # warm-up
            await socket_trip()
            await http_trip()
        out = []
        for r in range(runs):
            lat: dict[str, list[float]] = {"socket": [], "http": []}
            blocks = max(1, n // 20)
            for b in range(blocks):
                order = ("socket", "http") if (b + r) % 2 == 0 else ("http", "socket")
                for kind in order:
                    trip = socket_trip if kind == "socket" else http_trip
                    for _ in range(20):
                        lat[kind].append(await trip())
            run = {f"{k}_p50_ms": ms(percentile(v, 0.5)) for k, v in lat.items()}
            run.update({f"{k}_p90_ms": ms(percentile(v, 0.9)) for k, v in lat.items()})
            run["ratio"] = run["socket_p50_ms"] / run["http_p50_ms"]
            out.append(run)
        return out
    finally:
        conn.close()
        await ws.close()


def row15_roundtrip(env: Env, node: NodeProc) -> Row:
    meter = CpuMeter({"bench": "self", "node": node.pid})
    with meter:
        runs = asyncio.run(_roundtrips(node.url, "rt", env.sizes.socket_roundtrips, env.sizes.runs))
    for run in runs:
        run.update(meter.figures(2 * env.sizes.socket_roundtrips * len(runs)))
    return make_row(
        "15-socket-roundtrip",
        "a frame to a cell, its on_message inserts a row and answers: round trip p50",
        runs,
        metric="ratio",
        metric_fmt="{:.2f}x",
        goal=Goal("<=", 1.3, "<= 1.3x"),
        figure="p50 {socket_p50_ms:.2f} ms (p90 {socket_p90_ms:.2f})",
        baseline="HTTP call, same insert: p50 {http_p50_ms:.2f} ms (p90 {http_p90_ms:.2f})",
    )


# --------------------------------------------------------------------------- 15-socket-broadcast


async def _broadcasts(
    base: str, cell: str, sockets: int, count: int, meter: CpuMeter
) -> list[dict[str, float]]:
    """Open ``sockets`` sockets to ``cell``, then ``count`` broadcasts one after another
    (``meter`` measures them, not the opening): per broadcast, the time from sending the
    call to its answer and to the last socket's frame."""
    from bench.http import _Conn, _request
    from bench.socket_load import open_many

    url = httpx.URL(base)
    host, port = url.host, url.port or 80
    ws_url = "ws" + base[len("http") :] + f"/cells/{CLS}/{cell}/ws"
    conns, failed = await open_many([ws_url] * sockets, 50)
    if failed:
        raise RuntimeError(f"{failed} of {sockets} sockets failed to open")
    http = await _Conn.open(host, port)
    state: dict[str, Any] = {"marker": "", "got": 0, "last": 0.0}
    done = asyncio.Event()

    async def reader(ws: Any) -> None:
        async for frame in ws:
            if state["marker"] and state["marker"] in frame:
                state["got"] += 1
                if state["got"] == sockets:
                    state["last"] = time.perf_counter()
                    done.set()

    readers = [asyncio.create_task(reader(ws)) for ws in conns]
    out = []
    try:
        for i in range(count + 2):  # the first two warm up
            if i == 2:
                meter.__enter__()
            marker = f"b{i:05d}"
            body = json.dumps({"text": marker}).encode()
            state.update(marker=marker, got=0, last=0.0)
            done.clear()
            t = time.perf_counter()
            status = await http.post(_request(host, port, f"/cells/{CLS}/{cell}/shout", body))
            answered = time.perf_counter()
            if status != 200:
                raise RuntimeError(f"shout answered {status}")
            await asyncio.wait_for(done.wait(), 30)
            if i >= 2:
                out.append({"answer_ms": ms(answered - t), "last_ms": ms(state["last"] - t)})
            await asyncio.sleep(0.05)
        meter.__exit__(None, None, None)
    finally:
        http.close()
        for task in readers:
            task.cancel()
        await asyncio.gather(*(ws.close() for ws in conns), return_exceptions=True)
    return out


def row15_broadcast(env: Env, node: NodeProc) -> Row:
    sockets, count = env.sizes.broadcast_sockets, env.sizes.broadcasts
    runs = []
    for r in range(env.sizes.runs):
        meter = CpuMeter({"bench": "self", "node": node.pid})
        each = asyncio.run(_broadcasts(node.url, f"bc{r}", sockets, count, meter))
        last = [e["last_ms"] for e in each]
        run = {
            "last_p50_ms": percentile(last, 0.5),
            "last_max_ms": max(last),
            "answer_p50_ms": percentile([e["answer_ms"] for e in each], 0.5),
        }
        run.update(meter.figures(count))
        runs.append(run)
    return make_row(
        "15-socket-broadcast",
        f"one call makes a cell broadcast to its {sockets:,} sockets: until the last has it",
        runs,
        metric="last_p50_ms",
        metric_fmt="{:.1f} ms",
        goal=Goal("<=", 50.0, "<= 50 ms"),
        figure="p50 {last_p50_ms:.1f} ms (max {last_max_ms:.1f}; call answered "
        "{answer_p50_ms:.1f})",
        note="CPU per broadcast (the call and all its frames, 50 ms pauses between "
        "broadcasts included) in the cpu table",
    )


# --------------------------------------------------------------------------- the group


def row15(env: Env) -> list[Row]:
    """The three rows: density on nodes of their own, then one node for the others."""
    rows = [row15_density(env)]
    node = _node(env, "sockets", "sockets")
    node.start().ready()
    try:
        rows.append(row15_roundtrip(env, node))
        rows.append(row15_broadcast(env, node))
    finally:
        node.stop()
    return rows
