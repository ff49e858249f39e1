"""A fleet of real ``cellactors serve`` processes, each reaching SeaweedFS through its own
:class:`~tests.faults.proxy.FaultProxy`, so a fault can target one node.

Built by composition on ``tests/helpers/fleet.py``: every node is a
:class:`~tests.helpers.fleet.NodeProc` (with ``--endpoint`` set to its proxy) inside a
:class:`~tests.helpers.fleet.Fleet`; :class:`FaultNode` pairs it with its proxy and reads its
log (stderr and stdout go to one file per start) and exit status.
"""

from __future__ import annotations

import re
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from cellactors.persistence.store.embedded import SeaweedServer
from cellactors.persistence.store.s3 import S3Bucket
from tests.faults.ledger import Ledger, check_ledgers
from tests.faults.proxy import FaultProxy, Request
from tests.helpers.fleet import Fleet, NodeProc, wait_for, write_app
from tests.helpers.stores import make_s3_bucket

# The runtime's logging format: "%(asctime)s %(levelname)s %(name)s: %(message)s", its time
# local with the offset (cellactors.clock.local_time).
_LOG_LINE = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d) ([A-Z]+) ([\w.]+): (.*)$"
)
FENCE_MARK = "SELF-FENCE:"


def log_time(line: str) -> float | None:
    """The wall time (``time.time()`` scale) of a logging-formatted line, else None. The
    runtime logs local time with millisecond resolution."""
    match = _LOG_LINE.match(line)
    if match is None:
        return None
    return datetime.fromisoformat(match.group(1)).timestamp()


def is_log_line(line: str) -> bool:
    return _LOG_LINE.match(line) is not None


@dataclass
class FaultNode:
    """One ``cellactors serve`` process and the proxy that is its only way to the store."""

    proc: NodeProc
    proxy: FaultProxy

    @property
    def node_id(self) -> str:
        return self.proc.node_id

    @property
    def public_url(self) -> str:
        return self.proc.public_url

    @property
    def running(self) -> bool:
        return self.proc.running

    @property
    def log_path(self) -> Path | None:
        """The log file of the current (or last) start."""
        return self.proc.log_path

    @property
    def exit_code(self) -> int | None:
        """None while running (or never started)."""
        return None if self.proc.proc is None else self.proc.proc.poll()

    def start(self) -> FaultNode:
        self.proc.start()
        return self

    def ready(self, timeout: float = 30.0) -> FaultNode:
        self.proc.ready(timeout)
        return self

    def signal(self, sig: signal.Signals) -> None:
        self.proc.signal(sig)

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout)

    def kill(self) -> None:
        self.proc.kill()

    def lines(self) -> list[str]:
        return self.proc.output().splitlines()

    def tail(self, n: int = 4000) -> str:
        return self.proc.output()[-n:]

    def fence_lines(self) -> list[str]:
        """Every line carrying ``SELF-FENCE:`` (the logged one and the bare one)."""
        return [line for line in self.lines() if FENCE_MARK in line]

    def fence_time(self) -> float | None:
        """When the first logging-formatted ``SELF-FENCE:`` line was written, if any."""
        for line in self.lines():
            if FENCE_MARK in line:
                at = log_time(line)
                if at is not None:
                    return at
        return None

    def wait_fence_time(self, timeout: float) -> float:
        return wait_for(
            f"a timestamped {FENCE_MARK} line from {self.node_id}", self.fence_time, timeout
        )


class FaultFleet:
    """Nodes ``<tag>-0..n-1`` on one fresh bucket, each through its own proxy."""

    def __init__(
        self,
        root: Path,
        seaweed: SeaweedServer,
        size: int = 3,
        lease_ttl: float = 2.0,
        tag: str = "f",
        extra: Sequence[str] = (),
    ) -> None:
        self.root = root
        self.seaweed = seaweed
        self.bucket: S3Bucket = make_s3_bucket(seaweed.endpoint)
        app = write_app(root)
        self.nodes: list[FaultNode] = []
        for i in range(size):
            node_id = f"{tag}-{i}"
            proxy = FaultProxy(seaweed.endpoint, name=node_id).start()
            proc = NodeProc(
                node_id,
                app,
                root / f"n{i}",
                f"s3://{self.bucket.bucket}",
                proxy.endpoint,
                lease_ttl=lease_ttl,
                extra=list(extra),
            )
            self.nodes.append(FaultNode(proc, proxy))
        self.fleet = Fleet([n.proc for n in self.nodes])

    def __getitem__(self, i: int) -> FaultNode:
        return self.nodes[i]

    def __iter__(self) -> Iterator[FaultNode]:
        return iter(self.nodes)

    def start(self, timeout: float = 40.0) -> FaultFleet:
        self.fleet.start(timeout)
        return self

    @property
    def urls(self) -> list[str]:
        return self.fleet.urls

    def live_urls(self) -> list[str]:
        return [n.public_url for n in self.nodes if n.running]

    def urls_except(self, *nodes: FaultNode) -> Callable[[], list[str]]:
        """A ``urls()`` callable for writers: every node but ``nodes``."""
        urls = [n.public_url for n in self.nodes if n not in nodes]
        return lambda: urls

    def by_id(self, node_id: str) -> FaultNode:
        return next(n for n in self.nodes if n.node_id == node_id)

    def owner(self, cell: str) -> FaultNode:
        """The single running node hosting ``Ledger:<cell>``."""
        proc, _ = self.fleet.owner(f"Ledger:{cell}")
        return self.by_id(proc.node_id)

    def epoch(self, cell: str) -> int:
        _, state = self.fleet.owner(f"Ledger:{cell}")
        return int(state["epoch"])

    def requests(self) -> list[Request]:
        """Every request of every proxy."""
        return [r for n in self.nodes for r in n.proxy.log()]

    def check(
        self, ledgers: Iterable[Ledger], read_urls: list[str] | None = None
    ) -> dict[str, list[str]]:
        """The ledger checks of :func:`tests.faults.ledger.check_ledgers`, reading live
        through the running nodes (or ``read_urls``); returns the live entries by cell."""
        return check_ledgers(
            ledgers,
            read_urls=self.live_urls() if read_urls is None else read_urls,
            bucket=self.bucket.bucket,
            endpoint=self.seaweed.endpoint,
            requests=self.requests(),
            workdir=self.root / "restores",
        )

    def stop(self) -> None:
        """Kill every process, then stop the proxies (dropping anything still held)."""
        self.fleet.stop()
        for node in self.nodes:
            node.proxy.clear()
            node.proxy.stop()


# --------------------------------------------------------------------------- scenario helpers


def warm(fleet: FaultFleet, node: FaultNode, *cells: str) -> list[Ledger]:
    """A ledger per cell, each placed on ``node`` by a first append there."""
    ledgers = []
    for cell in cells:
        ledger = Ledger(cell)
        first = ledger.append(node.public_url, f"warm-{cell}")
        assert first.acked and first.node == node.node_id, first
        ledgers.append(ledger)
    return ledgers


def progress(ledgers: list[Ledger], after: float, count: int, timeout: float, what: str) -> None:
    """Wait until every ledger has ``count`` acknowledgements received after wall time
    ``after``."""
    wait_for(
        f"{count} acks per ledger {what}",
        lambda: all(len(ledger.acked_after(after)) >= count for ledger in ledgers),
        timeout,
    )


def keeps_serving(node: FaultNode, ledger: Ledger, seconds: float) -> None:
    """Watch ``node`` for ``seconds`` (the scenario's observation window): it must stay up
    and unfenced throughout, and acknowledge a write at the end."""
    end = time.monotonic() + seconds
    tick = threading.Event()
    while time.monotonic() < end:
        assert node.running, f"{node.node_id} exited with {node.exit_code}:\n{node.tail()}"
        assert node.fence_time() is None, f"{node.node_id} fenced itself:\n{node.tail()}"
        tick.wait(0.1)
    attempt = ledger.append(node.public_url, f"alive-{time.time():.3f}", timeout=20)
    assert attempt.acked, f"{node.node_id} stopped acknowledging: {attempt}"


def held_calls(node: FaultNode, cell_id: str) -> int:
    """Committed but unacknowledged transactions of ``cell_id`` on ``node`` (from /state)."""
    cell = node.proc.hosted().get(cell_id)
    return 0 if cell is None else int(cell["committed_txid"]) - int(cell["acked_txid"])
