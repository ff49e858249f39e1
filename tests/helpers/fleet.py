"""Real ``cellactors serve`` processes for the CLI and fleet tests.

Each node is ``sys.executable -m cellactors.cli serve ...`` with its own ports (from
:func:`free_port`), data directory and log file. Every wait polls with a deadline; nothing
sleeps for synchronization.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx

from cellactors.cli.failures import EXIT_ADDRESS_IN_USE
from cellactors.persistence.store.embedded import free_port
from cellactors.persistence.store.s3 import S3Bucket

T = TypeVar("T")

REPO = Path(__file__).resolve().parents[2]
COUNTER_APP = REPO / "examples" / "counter.py"
NODE_HEADER = "X-Cellactors-Node"

# The cells the fleet tests serve: written to a temporary file and passed as --app.
APP_SOURCE = '''
from cellactors import CellActor


class Ledger(CellActor):
    """An append-only list of unique entries: what was acknowledged must be in it."""

    def on_activate(self):
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS entries (seq INTEGER PRIMARY KEY, entry TEXT UNIQUE)"
        )

    def append(self, entry):
        self.db.execute("INSERT INTO entries (entry) VALUES (?)", [entry])
        return self.db.execute("SELECT count(*) FROM entries").fetchone()[0]

    def entries(self):
        return [r[0] for r in self.db.execute("SELECT entry FROM entries ORDER BY seq")]

    def fail(self, message="boom"):
        self.db.execute("INSERT INTO entries (entry) VALUES (?)", ["never-" + message])
        raise ValueError(message)

    def echo(self, data=""):
        return len(data)


class Tally(CellActor):
    """Appends without a uniqueness constraint: a call applied twice shows up twice."""

    def on_activate(self):
        self.db.execute("CREATE TABLE IF NOT EXISTS rows (seq INTEGER PRIMARY KEY, entry TEXT)")

    def add(self, entry):
        self.db.execute("INSERT INTO rows (entry) VALUES (?)", [entry])
        return self.db.execute("SELECT count(*) FROM rows").fetchone()[0]

    def rows(self):
        return [r[0] for r in self.db.execute("SELECT entry FROM rows ORDER BY seq")]
'''


def write_app(folder: Path) -> Path:
    """The fleet test app as a file under ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "fleet_app.py"
    path.write_text(APP_SOURCE)
    return path


def wait_for(what: str, check: Callable[[], T | None], timeout: float, interval: float = 0.05) -> T:
    """Poll ``check`` until it returns something truthy; AssertionError after ``timeout``."""
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        try:
            value = check()
        except Exception as err:  # the thing polled may not be up yet
            last_error = err
            value = None
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"timed out after {timeout:g}s waiting for {what} ({last_error!r})"
            )
        time.sleep(interval)


def cell_keys(bucket: S3Bucket, cell_id: str) -> list[str]:
    """Every key under ``cells/<cell_id>/``."""
    return [o.key for o in bucket.list(f"cells/{cell_id}/")]


@dataclass
class NodeProc:
    """One ``cellactors serve`` process (restartable with the same identity and ports)."""

    node_id: str
    app: Path
    workdir: Path
    bucket_spec: str | None = None
    endpoint: str | None = None
    lease_ttl: float = 2.0
    extra: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    public_port: int = field(default_factory=free_port)
    internal_port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None
    starts: int = 0
    served: bool = False  # it has answered /healthz once: its ports are known to peers

    @property
    def public_url(self) -> str:
        return f"http://127.0.0.1:{self.public_port}"

    @property
    def internal_url(self) -> str:
        return f"http://127.0.0.1:{self.internal_port}"

    def args(self) -> list[str]:
        args = [
            sys.executable,
            "-m",
            "cellactors.cli",
            "serve",
            "--app",
            str(self.app),
            "--node",
            self.node_id,
            "--listen",
            f"127.0.0.1:{self.public_port}",
            "--internal-listen",
            f"127.0.0.1:{self.internal_port}",
            "--data-dir",
            str(self.workdir / "data"),
            "--lease-ttl",
            str(self.lease_ttl),
        ]
        if self.bucket_spec is not None:
            args += ["--bucket", self.bucket_spec]
        if self.endpoint is not None:
            args += ["--endpoint", self.endpoint]
        return args + self.extra

    def start(self) -> NodeProc:
        """Launch the process (output to a fresh log file); does not wait for readiness."""
        assert self.proc is None or self.proc.poll() is not None, "already running"
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.starts += 1
        self.log_path = self.workdir / f"{self.node_id}.{self.starts}.log"
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        with open(self.log_path, "wb") as out:
            self.proc = subprocess.Popen(
                self.args(), stdout=out, stderr=subprocess.STDOUT, env=env, cwd=self.workdir
            )
        return self

    def ready(self, timeout: float = 30.0) -> NodeProc:
        """Wait until the public /healthz answers 200 (fail early if the process exits).

        A free port is only free when it is picked: another process of the test run may bind
        it before this one does. A node that has never served and exits because a listen
        address is taken is started again on fresh ports (a restart keeps its ports)."""
        deadline = time.monotonic() + timeout
        moves = 0
        while True:
            assert self.proc is not None
            code = self.proc.poll()
            if code == EXIT_ADDRESS_IN_USE and not self.served and moves < 3:
                moves += 1
                self.public_port, self.internal_port = free_port(), free_port()
                self.start()
                continue
            if code is not None:
                raise RuntimeError(f"{self.node_id} exited with {code}:\n{self.output()[-3000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.public_url + "/healthz", timeout=1).status_code == 200:
                    self.served = True
                    return self
            if time.monotonic() >= deadline:
                raise AssertionError(f"{self.node_id} not ready in {timeout:g}s:\n{self.output()}")
            time.sleep(0.05)

    def output(self) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")

    def signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def wait(self, timeout: float) -> int:
        """The exit status, waiting at most ``timeout`` seconds."""
        assert self.proc is not None
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"{self.node_id} still running after {timeout:g}s:\n{self.output()[-3000:]}"
            ) from None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def state(self, timeout: float = 5.0) -> dict[str, Any]:
        resp = httpx.get(self.internal_url + "/state", timeout=timeout)
        resp.raise_for_status()
        result: dict[str, Any] = resp.json()
        return result

    def hosted(self) -> dict[str, dict[str, Any]]:
        """Cells active on this node, by cell id."""
        return {c["cell"]: c for c in self.state()["cells"]}

    def kill(self) -> None:
        """SIGKILL (after SIGCONT, in case it is stopped) and reap."""
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
        self.proc.wait(timeout=10)


class Fleet:
    """Several nodes on one bucket."""

    def __init__(self, nodes: list[NodeProc]) -> None:
        self.nodes = nodes

    def __iter__(self) -> Iterator[NodeProc]:
        return iter(self.nodes)

    def __getitem__(self, i: int) -> NodeProc:
        return self.nodes[i]

    @property
    def urls(self) -> list[str]:
        return [n.public_url for n in self.nodes]

    def start(self, timeout: float = 40.0) -> Fleet:
        for node in self.nodes:
            node.start()
        for node in self.nodes:
            node.ready(timeout)
        return self

    def owners(self, cell_id: str) -> list[tuple[NodeProc, dict[str, Any]]]:
        """Running nodes whose /state lists ``cell_id``, with its entry."""
        found = []
        for node in self.nodes:
            if not node.running:
                continue
            with contextlib.suppress(httpx.HTTPError):
                cell = node.hosted().get(cell_id)
                if cell is not None:
                    found.append((node, cell))
        return found

    def owner(self, cell_id: str) -> tuple[NodeProc, dict[str, Any]]:
        """The single node hosting ``cell_id`` (asserts exactly one)."""
        found = self.owners(cell_id)
        assert len(found) == 1, f"{cell_id} hosted on {[n.node_id for n, _ in found]}"
        return found[0]

    def stop(self) -> None:
        for node in self.nodes:
            node.kill()


@dataclass
class Ack:
    """One acknowledged write: the entry, the node that executed it and when."""

    entry: str
    node: str
    at: float


@dataclass
class Writer:
    """A thread appending unique entries to a Ledger cell through some nodes' public URLs.

    Raw httpx rather than :class:`cellactors.Client`, to see which node executed each call
    (the ``X-Cellactors-Node`` header). Only 200 answers count as acknowledged; any other
    outcome (error answer, timeout, refused connection) is recorded as uncertain.
    """

    urls: Callable[[], list[str]]
    cell: str
    tag: str
    timeout: float = 5.0
    acks: list[Ack] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    stop_event: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> Writer:
        self.thread = threading.Thread(target=self._run, name=f"writer-{self.tag}", daemon=True)
        self.thread.start()
        return self

    def _run(self) -> None:
        i = 0
        with httpx.Client(timeout=httpx.Timeout(self.timeout, connect=1.0)) as http:
            while not self.stop_event.is_set():
                urls = self.urls()
                if not urls:
                    self.stop_event.wait(0.05)
                    continue
                url = urls[i % len(urls)]
                entry = f"{self.tag}-{i}"
                i += 1
                try:
                    resp = http.post(
                        f"{url}/cells/Ledger/{self.cell}/append", json={"entry": entry}
                    )
                except httpx.HTTPError as err:
                    with self.lock:
                        self.failures.append(f"{entry}: {err!r}")
                    self.stop_event.wait(0.05)
                    continue
                if resp.status_code == 200:
                    with self.lock:
                        self.acks.append(
                            Ack(entry, resp.headers.get(NODE_HEADER, ""), time.monotonic())
                        )
                else:
                    with self.lock:
                        self.failures.append(f"{entry}: {resp.status_code} {resp.text[:200]}")
                    self.stop_event.wait(0.05)

    def acked(self) -> list[Ack]:
        with self.lock:
            return list(self.acks)

    def acks_after(self, t: float) -> list[Ack]:
        return [a for a in self.acked() if a.at > t]

    def stop(self, timeout: float = 30.0) -> None:
        self.stop_event.set()
        if self.thread is not None:
            self.thread.join(timeout)
            assert not self.thread.is_alive(), f"writer {self.tag} did not stop"


def ledger_entries(urls: list[str], cell: str, timeout: float = 30.0) -> list[str]:
    """The Ledger's entries, read through whichever node answers (retrying while the cell
    moves)."""
    found: list[list[str]] = []

    def read() -> bool:
        for url in urls:
            with contextlib.suppress(httpx.HTTPError):
                resp = httpx.post(f"{url}/cells/Ledger/{cell}/entries", json={}, timeout=5)
                if resp.status_code == 200:
                    found.append(resp.json()["result"])
                    return True
        return False

    wait_for(f"entries of Ledger:{cell}", read, timeout)
    return found[-1]
