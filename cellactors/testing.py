"""A fleet of cellactors nodes inside a test process (docs/testing.md).

``Fleet([Counter], nodes=3)`` starts N in-process nodes sharing one in-memory bucket (or,
with ``store="seaweedfs"``, an embedded SeaweedFS), serving the given cell classes. A test
calls cells through any node (a call reaching a node that does not own the cell is passed to
the owner, as the HTTP layer forwards it), breaks nodes the way production breaks them, and
asserts on what the bucket holds, which is what survives any failure:

- :meth:`Fleet.kill`: the process dies. No cell or lease is released; its lease is expired
  at once (as if its TTL had passed), so the next call through another node takes over.
- :meth:`Fleet.pause`: the process freezes past its TTL (SIGSTOP): it stops renewing, its
  lease expires for the others, and :meth:`Fleet.resume` wakes it to find its deadline
  passed, so it fences itself, as a real node does.
- :meth:`Fleet.drain`: a graceful stop (SIGTERM): every cell released, the lease expired.
- :meth:`Fleet.acknowledged`: the cell's database rebuilt read-only from the bucket (every
  acknowledged write), as table name -> rows; :meth:`Fleet.changes` its change feed.
- :meth:`Fleet.advance_alarms`: move alarm time forward, so that alarms and schedules due by
  then fire now.
- :meth:`Fleet.dead_letters`, :meth:`Fleet.retry_dead_letters`,
  :meth:`Fleet.purge_dead_letters`: the outbox messages a cell's outbox gave up.

The pytest fixture ``cellactors_fleet`` (enabled by ``pytest_plugins = ["cellactors.testing"]``
in a ``conftest.py``, or automatically through the package's ``pytest11`` entry point) makes
fleets and stops them after the test.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from cellactors.actors.cell import CellActor
from cellactors.actors.node import Node, NodeSettings
from cellactors.actors.node.rolling_back import RollbackResult, roll_back
from cellactors.core import keys
from cellactors.core.changes import Change
from cellactors.core.principal import Principal
from cellactors.core.routing import reroutable_error
from cellactors.core.types import Applied, Match
from cellactors.errors import CallError, NodeUnavailable, RemoteOwner
from cellactors.persistence.celldb.calls import RESERVED_PREFIX
from cellactors.persistence.celldb.database import CellDatabase
from cellactors.persistence.celldb.runtime_tables import DeadLetter
from cellactors.persistence.control.leases import LeaseStore
from cellactors.persistence.control.ownership import OwnershipStore
from cellactors.persistence.history.feed import read_changes
from cellactors.persistence.history.restore import restore
from cellactors.persistence.store.bucket import Bucket
from cellactors.persistence.store.memory import MemoryBucket

__all__ = ["Fleet", "NodeDown", "cellactors_fleet"]

#: Lease TTL of a test fleet: short, so that a pause is over quickly, yet long enough for a
#: loaded machine to renew (every TTL/3). Takeovers never wait for it: kill and pause expire
#: the lease directly.
DEFAULT_TTL = 3.0
#: How long ``advance_alarms`` and ``settle`` wait for the fleet to be idle, and how often
#: they look.
SETTLE_TIMEOUT_S = 10.0
SETTLE_POLL_S = 0.01

T = TypeVar("T")


class NodeDown(AssertionError):
    """A test called a cell through a node it killed, paused or drained."""


class Fleet:
    """N started nodes on one bucket, with the user's cell classes."""

    def __init__(
        self,
        classes: Iterable[type[CellActor]],
        nodes: int = 3,
        *,
        bucket: Bucket | None = None,
        store: str = "memory",
        ttl: float = DEFAULT_TTL,
        settings: NodeSettings | None = None,
        data_dir: str | Path | None = None,
    ) -> None:
        if nodes < 1:
            raise ValueError("a fleet needs at least one node")
        self.classes = list(classes)
        self._tmp = tempfile.TemporaryDirectory(prefix="cellactors-fleet-")
        self.data_dir = Path(data_dir) if data_dir is not None else Path(self._tmp.name)
        self._server: Any = None
        base = settings or NodeSettings()
        self.settings = replace(base, lease_ttl=ttl, debug=True)  # tests see tracebacks
        self.nodes: list[Node] = []
        self._down: dict[str, str] = {}  # node id -> why it takes no calls
        self._advanced_s = 0.0  # how far advance_alarms moved the nodes' runtime clocks
        try:  # on any failure the nodes and the store started so far stop
            self.bucket = bucket if bucket is not None else self._open_store(store)
            for index in range(nodes):
                self.nodes.append(self._start(f"node-{index}", index))
        except BaseException:
            self.close()
            raise

    def _open_store(self, store: str) -> Bucket:
        if store == "memory":
            return MemoryBucket("fleet")
        if store == "seaweedfs":
            from cellactors.persistence.store.embedded import SeaweedServer
            from cellactors.persistence.store.s3 import S3Bucket

            # Signed with the keys the store made (its S3 accepts no other), never AWS_*
            # from the environment: works on a machine with no AWS configuration at all.
            self._server = SeaweedServer(self.data_dir / "seaweedfs")
            self._server.start()  # stops its process itself when it fails
            keys = self._server.credentials
            bucket = S3Bucket(
                "fleet",
                "",
                endpoint=self._server.endpoint,
                region="us-east-1",
                access_key=keys.access_key_id,
                secret_key=keys.secret_access_key,
            )
            bucket.ensure_exists()
            return bucket
        raise ValueError(f"store must be 'memory' or 'seaweedfs', not {store!r}")

    def _start(self, node_id: str, index: int) -> Node:
        settings = replace(
            self.settings,
            advertise=f"127.0.0.1:{20000 + index}",  # in-process: never dialled
            data_dir=self.data_dir / "nodes",
        )
        node = Node(self.bucket, node_id, self.classes, settings)
        node.clock.advance(self._advanced_s)  # a restarted node agrees with the others
        node.start()
        node.set_forwarder(self._forward)  # calls between cells and the outbox reach peers
        return node

    def _forward(
        self,
        owner: RemoteOwner,
        cls_name: str,
        name: str,
        method: str,
        kwargs: dict[str, Any],
        key: str | None,
        chain: tuple[str, ...],
        caller: Principal | None = None,
    ) -> Any:
        """A call a node hands to the owner of its cell: the owner's ``Node`` runs it, as
        its internal listener would; a stopped owner never answers (the call ran nowhere)."""
        target = next((n for n in self.nodes if n.node_id == owner.node), None)
        if target is None or owner.node in self._down:
            raise NodeUnavailable(f"{owner.node} is down")
        return target.call(
            cls_name, name, method, kwargs, forwarded=True, key=key, chain=chain, caller=caller
        )

    # --- nodes ---------------------------------------------------------------------------

    def node(self, which: int | str | Node) -> Node:
        """A node by index, id, or itself."""
        if isinstance(which, Node):
            return which
        if isinstance(which, int):
            return self.nodes[which]
        for node in self.nodes:
            if node.node_id == which:
                return node
        raise KeyError(f"no node {which!r} in this fleet")

    def live(self) -> list[Node]:
        """The nodes that take calls."""
        return [n for n in self.nodes if n.node_id not in self._down]

    def kill(self, which: int | str | Node) -> Node:
        """Crash a node: nothing is released, its lease is expired at once."""
        node = self.node(which)
        node.lease.proxy().pause().get()
        node.fence("cellactors.testing: killed")
        self._down[node.node_id] = "killed"
        self.expire_lease(node.node_id)
        return node

    def pause(self, which: int | str | Node) -> Node:
        """Freeze a node past its TTL: it renews nothing and its lease expires for the
        others; it keeps its cells in memory until :meth:`resume`."""
        node = self.node(which)
        node.lease.proxy().pause().get()
        self._down[node.node_id] = "paused"
        self.expire_lease(node.node_id)
        return node

    def resume(self, which: int | str | Node) -> Node:
        """Wake a paused node: its fence deadline passed while it was frozen, so it fences
        (sends nothing more, answers nothing)."""
        node = self.node(which)
        node.fence("cellactors.testing: resumed after a pause past its lease TTL")
        self._down[node.node_id] = "fenced after a pause"
        return node

    def drain(self, which: int | str | Node) -> Node:
        """Stop a node gracefully: every cell released, its lease expired."""
        node = self.node(which)
        node.drain()
        self._down[node.node_id] = "drained"
        return node

    def restart(self, which: int | str | Node) -> Node:
        """Start a new process (generation) under a stopped node's id, in its place."""
        old = self.node(which)
        if old.node_id not in self._down:
            raise ValueError(f"{old.node_id} is running; kill, pause or drain it first")
        index = self.nodes.index(old)
        with contextlib.suppress(Exception):
            old.stop()
        new = self._start(old.node_id, index)
        self.nodes[index] = new
        del self._down[old.node_id]
        return new

    def expire_lease(self, node_id: str) -> None:
        """Make a node's lease look expired to every peer (what its TTL passing does)."""
        leases = LeaseStore(self.bucket, node_id)
        snap = leases.read_lease(node_id)
        if snap is None:
            return
        result = leases.cas_node_lease(Match(snap.token), replace(snap.lease, expires_ms=0))
        if not isinstance(result, Applied):
            raise AssertionError(f"the lease of {node_id} changed while it was being expired")

    def advance_alarms(self, seconds: float, timeout: float = SETTLE_TIMEOUT_S) -> None:
        """Move alarm time forward by ``seconds`` on every node: alarms and schedules due by
        then fire now (hosted cells from their node's timer, others from a scan run at once;
        a recurring schedule runs once, its runs missed meanwhile coalesced), and this
        returns once they have run (an :class:`AssertionError` naming what is still pending
        after ``timeout`` seconds). Leases keep the real clock, so no node expires. The
        fleet's teardown moves the clock back."""
        for node in self.nodes:
            node.clock.advance(seconds)
        self._advanced_s += seconds
        for node in self.nodes:
            if node.node_id not in self._down:
                node.alarms.poke()
        self._wait_idle("advance_alarms", timeout, outboxes=False)

    def settle(self, timeout: float = SETTLE_TIMEOUT_S) -> None:
        """Wait until every live node is idle: no alarm due and not yet run, no scan under
        way, no outbox with a message to deliver (a delivery retrying after a failure
        counts as pending). An :class:`AssertionError` after ``timeout`` seconds names what
        is still pending on which node."""
        self._wait_idle("settle", timeout, outboxes=True)

    def _pending(self, outboxes: bool) -> list[str]:
        found = []
        for node in self.nodes:
            if node.node_id in self._down or node.status != "serving":
                continue
            work = list(node.alarms.pending())
            if outboxes:
                work += [f"the outbox of {cell_id}" for cell_id in node.outbox.pending()]
            found += [f"{node.node_id}: {what}" for what in work]
        return found

    def _wait_idle(self, what: str, timeout: float, *, outboxes: bool) -> None:
        """Poll until two looks in a row find nothing pending (work may hop between nodes,
        a delivery waking its target's outbox, between the looks at two nodes)."""
        deadline = time.monotonic() + timeout
        quiet = 0
        while True:
            pending = self._pending(outboxes)
            quiet = 0 if pending else quiet + 1
            if quiet >= 2:
                return
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{what}: still pending after {timeout:g}s: {'; '.join(pending)}"
                )
            time.sleep(SETTLE_POLL_S)

    # --- calls ---------------------------------------------------------------------------

    def call(
        self,
        cls: type[CellActor] | str,
        name: str,
        method: str,
        /,
        *args: Any,
        via: int | str | Node | None = None,
        key: str | None = None,
        **kwargs: Any,
    ) -> Any:
        """Call ``method`` on the cell through node ``via`` (default: the first live one);
        like the HTTP layer, a call for a cell a live peer owns is handed to that peer."""
        cls_name = cls if isinstance(cls, str) else cls.__name__
        entry = self.live()[0] if via is None else self.node(via)
        if entry.node_id in self._down:
            raise NodeDown(f"{entry.node_id} is {self._down[entry.node_id]}")
        return self._routed(
            entry,
            cls_name,
            name,
            lambda node, forwarded: node.call(
                cls_name, name, method, kwargs, args=args, key=key, forwarded=forwarded
            ),
        )

    def _routed(self, entry: Node, cls_name: str, name: str, run: Callable[[Node, bool], T]) -> T:
        """``run`` on ``entry``, or on the live peer that owns the cell, as the HTTP layer
        routes a call: an answer that proves it ran nowhere because of the route
        (:mod:`cellactors.core.routing`; a killed owner never answers) forgets the route and
        decides once more; never a third hop."""
        for attempt in (1, 2):
            try:
                return run(entry, False)
            except RemoteOwner as owner:
                try:
                    if owner.node in self._down:
                        raise NodeUnavailable(f"{owner.node} is {self._down[owner.node]}")
                    return run(self.node(owner.node), True)
                except CallError as err:
                    if attempt == 2 or not reroutable_error(err):
                        if owner.node in self._down:
                            raise NodeDown(
                                f"{owner.node} owns {cls_name}:{name} but is down"
                            ) from owner
                        raise
                    entry.forget_route(cls_name, name)
        raise AssertionError("unreachable")  # pragma: no cover

    def cell(
        self, cls: type[CellActor] | str, name: str, via: int | str | Node | None = None
    ) -> _FleetCell:
        """A handle whose attribute calls go through :meth:`call`."""
        return _FleetCell(self, cls, name, via)

    # --- dead letters ----------------------------------------------------------------------

    def dead_letters(self, cls: type[CellActor] | str, name: str) -> list[DeadLetter]:
        """The cell's dead letters (outbox messages given up), on the node that owns it."""
        return self._on_owner(cls, name, lambda node: node.dead_letters(cls, name))

    def retry_dead_letters(
        self, cls: type[CellActor] | str, name: str, ids: Iterable[str] | None = None
    ) -> list[str]:
        """Move the cell's dead letters ``ids`` (default: all) back into its outbox, to be
        delivered again under the same message ids; the ids moved."""
        wanted = None if ids is None else list(ids)
        return self._on_owner(cls, name, lambda node: node.retry_dead_letters(cls, name, wanted))

    def purge_dead_letters(
        self, cls: type[CellActor] | str, name: str, ids: Iterable[str] | None = None
    ) -> list[str]:
        """Delete the cell's dead letters ``ids`` (default: all); the ids deleted."""
        wanted = None if ids is None else list(ids)
        return self._on_owner(cls, name, lambda node: node.purge_dead_letters(cls, name, wanted))

    def roll_back(
        self,
        cls: type[CellActor] | str,
        name: str,
        *,
        to_txid: int | None = None,
        at_ms: int | None = None,
    ) -> RollbackResult:
        """Roll the cell back in place on its owner (``cellactors rollback``): to right after
        ``to_txid`` or to its state at ``at_ms``; rolling back to ``undo_txid`` undoes it."""
        return self._on_owner(
            cls, name, lambda node: roll_back(node, cls, name, to_txid=to_txid, at_ms=at_ms)
        )

    def _on_owner(self, cls: type[CellActor] | str, name: str, run: Callable[[Node], T]) -> T:
        """``run`` on the cell's owner: the first live node, or the live peer it names."""
        cls_name = cls if isinstance(cls, str) else cls.__name__
        return self._routed(self.live()[0], cls_name, name, lambda node, _forwarded: run(node))

    # --- what the bucket holds ------------------------------------------------------------

    def owner(self, cls: type[CellActor] | str, name: str) -> str | None:
        """The node id ``own.json`` names for the cell (None: no record, or released)."""
        record = OwnershipStore(self.bucket, "fleet").read_owner(self._cell_id(cls, name))
        return None if record is None or record.released else record.node

    def acknowledged(
        self, cls: type[CellActor] | str, name: str
    ) -> dict[str, list[dict[str, Any]]]:
        """The cell's database as the bucket holds it (read-only restore): every table's
        rows as dicts, sorted, without the runtime's own tables. Whatever a caller was
        answered is in it."""
        cell_id = self._cell_id(cls, name)
        record = OwnershipStore(self.bucket, "fleet").read_owner(cell_id)
        if record is None:
            return {}
        with tempfile.TemporaryDirectory(dir=self.data_dir) as tmp:
            db = CellDatabase(Path(tmp) / "cell.db")
            try:
                restore(self.bucket, cell_id, record.epoch + 1, db, seal=False)
                return {
                    table.name: sorted(
                        (dict(row) for row in table.rows), key=lambda r: repr(sorted(r.items()))
                    )
                    for table in db.db.tables
                    if not table.name.startswith(RESERVED_PREFIX)
                }
            finally:
                db.close()

    def changes(self, cls: type[CellActor] | str, name: str, after: int = 0) -> list[Change]:
        """The cell's change feed after ``after`` (acknowledged transactions only)."""
        return read_changes(self.bucket, self._cell_id(cls, name), after).changes

    def _cell_id(self, cls: type[CellActor] | str, name: str) -> str:
        return keys.make_cell_id(cls if isinstance(cls, str) else cls.__name__, name)

    # --- lifecycle -----------------------------------------------------------------------

    def close(self) -> None:
        """Stop every node (a killed or fenced one without writing), then the store."""
        for node in self.nodes:
            with contextlib.suppress(Exception):
                node.stop()
        if self._server is not None:
            self._server.stop()
            self._server = None
        self._tmp.cleanup()

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _FleetCell:
    """``fleet.cell(Counter, "a").increment("x")``: calls through the fleet."""

    def __init__(
        self, fleet: Fleet, cls: type[CellActor] | str, name: str, via: int | str | Node | None
    ) -> None:
        self._fleet, self._cls, self._name, self._via = fleet, cls, name, via

    def __getattr__(self, method: str) -> Callable[..., Any]:
        if method.startswith("_"):
            raise AttributeError(method)

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._fleet.call(self._cls, self._name, method, *args, via=self._via, **kwargs)

        return call


try:
    import pytest
except ImportError:  # pragma: no cover - pytest is optional
    pass
else:

    @pytest.fixture
    def cellactors_fleet() -> Iterator[Callable[..., Fleet]]:
        """Make fleets with ``cellactors_fleet([MyCell], nodes=2)``; all stop after the test."""
        made: list[Fleet] = []

        def make(classes: Iterable[type[CellActor]], nodes: int = 3, **kw: Any) -> Fleet:
            fleet = Fleet(classes, nodes, **kw)
            made.append(fleet)
            return fleet

        yield make
        for fleet in made:
            fleet.close()
