"""Real in-process nodes served by the real runner on loopback, for the metrics, fleet and
browser tests: each node advertises its internal listener, so peers forward to it."""

from __future__ import annotations

import contextlib
import io
import socket
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from cellactors import CellActor, Node, NodeSettings
from cellactors.core import keys
from cellactors.persistence.store import records
from cellactors.persistence.store.bucket import Absent, Bucket
from cellactors.server.app import ServerSettings
from cellactors.server.peer_keys import KeySource
from cellactors.server.runner import Runner
from tests.helpers.cells import Counter, Sandbox
from tests.helpers.runtime import TTL, eventually

KEY = bytes(range(32))


def with_fleet_key(bucket: Bucket) -> Bucket:
    """``bucket`` holding :data:`KEY` as the fleet key (as ``serve`` writes it), so that an
    operator's command signs the requests these nodes accept."""
    body = records.encode({"version": 1, "key": KEY.hex()})
    bucket.put_cas(keys.PEER_AUTH_KEY, body, Absent())
    return bucket


@dataclass
class ServedNode:
    """One node and the runner serving it."""

    node: Node
    runner: Runner
    public_port: int
    internal_port: int
    exit_code: int | None = None

    @property
    def public(self) -> str:
        return f"http://127.0.0.1:{self.public_port}"

    @property
    def internal(self) -> str:
        return f"http://127.0.0.1:{self.internal_port}"


@contextlib.contextmanager
def served_node(
    bucket: Bucket,
    node_id: str,
    settings: ServerSettings | None = None,
    classes: Sequence[type[CellActor]] = (Counter, Sandbox),
    keys: bytes | KeySource = KEY,
    access_log: bool = False,
    **node_settings: Any,
) -> Iterator[ServedNode]:
    """Start ``node_id`` on ``bucket`` with both listeners on loopback until the block ends,
    then drain it (as SIGTERM would) and stop it. With ``access_log`` uvicorn logs every
    answer to the ``uvicorn.access`` logger. ``node_settings`` are more
    :class:`NodeSettings`."""
    # Bound here and held until the servers listen on them: a port merely "free a moment
    # ago" may be taken by another test worker before the runner binds it.
    held = {which: _bound_socket() for which in ("public", "internal")}
    public_port, internal_port = (held[w].getsockname()[1] for w in ("public", "internal"))
    tunables = NodeSettings(lease_ttl=TTL, advertise=f"127.0.0.1:{internal_port}", **node_settings)
    node = Node(bucket, node_id, list(classes), tunables).start()
    runner = Runner(
        node,
        keys,
        public=("127.0.0.1", public_port),
        internal=("127.0.0.1", internal_port),
        settings=settings,
        fence_stream=io.StringIO(),
        access_log=access_log,
        sockets=held,
    )
    served = ServedNode(node, runner, public_port, internal_port)

    def main() -> None:
        served.exit_code = runner.run(install_signals=False)

    thread = threading.Thread(target=main, name=f"runner-{node_id}", daemon=True)
    thread.start()
    try:
        eventually(lambda: runner.ready.is_set() or served.exit_code is not None, timeout=15)
        assert runner.ready.is_set(), f"runner of {node_id} exited with {served.exit_code}"
        yield served
    finally:
        runner.request_stop()
        thread.join(30)
        node.stop()
        assert not thread.is_alive(), f"runner of {node_id} did not stop"


def _bound_socket() -> socket.socket:
    """A TCP socket bound to a free port on loopback, not yet listening."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock
