"""Server processes of the suite: ``cellactors serve`` nodes and the bare Starlette endpoint,
each in its own interpreter (its own GIL, like a deployed node), on loopback ports."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from bench.common import COUNTER_APP, REPO
from cellactors.persistence.store.embedded import die_with_parent, free_port


class ServerProc:
    """A child process serving HTTP on ``port``; output goes to ``log_path``."""

    def __init__(self, name: str, args: list[str], port: int, workdir: Path) -> None:
        self.name = name
        self.args = args
        self.port = port
        self.workdir = workdir
        self.log_path = workdir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> ServerProc:
        """Launch (does not wait; see :meth:`ready`)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(
                self.args,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=REPO,
                preexec_fn=die_with_parent,  # a killed benchmark leaves no node behind
            )
        return self

    def ready(self, timeout: float = 60.0, path: str = "/healthz") -> ServerProc:
        """Wait until ``path`` answers 200; raise with the log tail if the process exits."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while True:
            code = self.proc.poll()
            if code is not None:
                raise RuntimeError(f"{self.name} exited with {code}: {self.tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + path, timeout=1).status_code == 200:
                    return self
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} not ready in {timeout:g}s: {self.tail()}")
            time.sleep(0.05)

    def tail(self, chars: int = 2000) -> str:
        if not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")[-chars:]

    def kill(self) -> None:
        """SIGKILL and reap."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM (a node drains), then SIGKILL after ``timeout``."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()


class NodeProc(ServerProc):
    """One ``cellactors serve`` process serving ``app`` (``examples/counter.py`` unless
    told otherwise: a file or a module). Without ``bucket_spec`` (and ``endpoint``) it
    starts its embedded store under its data directory, as ``serve`` without ``--bucket``
    does."""

    def __init__(
        self,
        node_id: str,
        workdir: Path,
        bucket_spec: str | None,
        endpoint: str | None,
        *,
        lease_ttl: float = 10.0,
        extra: tuple[str, ...] = (),
        app: str | Path = COUNTER_APP,
    ) -> None:
        port, self.internal_port = free_port(), free_port()
        self.lease_ttl = lease_ttl
        args = [
            sys.executable,
            "-m",
            "cellactors.cli",
            "serve",
            "--app",
            str(app),
            *(["--bucket", bucket_spec] if bucket_spec else []),
            *(["--endpoint", endpoint] if endpoint else []),
            "--node",
            node_id,
            "--listen",
            f"127.0.0.1:{port}",
            "--internal-listen",
            f"127.0.0.1:{self.internal_port}",
            "--data-dir",
            str(workdir / node_id),
            "--lease-ttl",
            str(lease_ttl),
            "--log-level",
            "warning",
            *extra,
        ]
        super().__init__(node_id, args, port, workdir)

    @property
    def internal_url(self) -> str:
        return f"http://127.0.0.1:{self.internal_port}"

    def bucket_counts(self) -> dict[tuple[str, str], int]:
        """The node's metered bucket requests by (operation, key kind), whatever their
        outcome, from /metrics."""
        text = httpx.get(self.internal_url + "/metrics", timeout=5).text
        counts: dict[tuple[str, str], int] = {}
        for m in re.finditer(r"cellactors_bucket_requests_total\{([^}]*)\} ([0-9.e+]+)", text):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
            key = (labels["op"], labels["kind"])
            counts[key] = counts.get(key, 0) + int(float(m.group(2)))
        return counts


class BareProc(ServerProc):
    """The bare Starlette+uvicorn endpoint of :mod:`bench.bare_app`, answering ``body``."""

    def __init__(self, workdir: Path, body: bytes) -> None:
        port = free_port()
        args = [sys.executable, "-m", "bench.bare_app", "--port", str(port), "--body", body.hex()]
        super().__init__("bare", args, port, workdir)
