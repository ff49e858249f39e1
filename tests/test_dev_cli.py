"""``cellactors dev`` as a real process: two nodes sharing one embedded store, a call
through node 1 read back through node 2 (forwarded), and SIGINT stopping every child."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from tests.helpers.fleet import COUNTER_APP, NODE_HEADER, wait_for

pytestmark = pytest.mark.fleet


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"  # exited, not yet reaped


def test_dev_fleet_forwards_and_stops_on_sigint(tmp_path: Path) -> None:
    args = ["dev", "--nodes", "2", "--base-port", "0", "--app", str(COUNTER_APP)]
    args += ["--data-dir", str(tmp_path / "dev"), "--lease-ttl", "3"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "cellactors.cli", *args],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    out: list[str] = []

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()

    def seen(text: str) -> bool:
        while not lines.empty():
            out.append(lines.get())
        assert proc.poll() is None, f"dev exited early: {''.join(out)}"
        return any(text in line for line in out)

    try:
        wait_for("the dev fleet", lambda: seen("fleet ready"), timeout=120)
        nodes = {}
        pids = []
        for line in out:
            m = re.match(r"(node-\d): public (\S+)\s+internal (\S+)\s+pid (\d+)", line)
            if m:
                nodes[m.group(1)] = m.group(2)
                pids.append(int(m.group(4)))
            m = re.match(r"store: .* \(pid (\d+)\)", line)
            if m:
                pids.append(int(m.group(1)))
        assert sorted(nodes) == ["node-1", "node-2"] and len(pids) == 3, out

        r = httpx.post(f"{nodes['node-1']}/cells/Counter/a/increment", json={"name": "x"})
        assert r.json() == {"result": 1} and r.headers[NODE_HEADER] == "node-1"
        r = httpx.post(f"{nodes['node-2']}/cells/Counter/a/get", json={"name": "x"})
        assert r.json() == {"result": 1}
        assert r.headers[NODE_HEADER] == "node-1", "node 2 did not forward to the owner"

        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=90) == 0
        wait_for("every child to exit", lambda: all(_gone(p) for p in pids), timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
