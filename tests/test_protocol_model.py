"""A model of the fleet protocol over the pure core (docs/protocol.md, "Invariants").

No threads, no real store, no SQLite: two or three simulated nodes (plus at most one zombie:
an old process of a node id, replaced while paused) share one :class:`MemoryBucket` and one
simulated wall clock (each node reads it with its own skew).
Each node keeps its cell's committed values in a list (txid i is ``state[i - 1]``), the epoch
it believes it owns and an :class:`AckGate`. Every protocol step is its own rule, so
hypothesis interleaves them: a claim can race another node's claim, a restore can be paused
between its listing and its seals, and an upload can land long after its node was paused,
crashed or replaced.

With ``lagging`` set, the store's listings omit every object written in the last
``LAG_MS`` (a store without list-after-write), and only graceful hand-offs move the cell:
the release records its acknowledged txid in ``own.json``, and the next restore must not
seal or open below it (``restore_plan.Lagging``: it lists again later). A recovery
without a release (a takeover after a crash, or the same node id acquiring again after its
process or its cell was lost) needs listings that show every write at once, which
``cellactors qualify`` checks.

Active owners also snapshot acknowledged state (an upload that may land late, like a
batch) and then collect what the snapshot covers, in steps others interleave with: the
ownership re-read, then the deletes, which a node paused in between may issue after a
takeover.

What is real: the ownership and lease stores, the decision functions of
:mod:`cellactors.core` (the whole-restore planner included), the seal create/read and the
garbage collection's choice and ownership check of :mod:`cellactors.persistence.history.restore`,
and the key layout. What is simulated: batch and snapshot bodies (JSON), time, and the
restore executor (a re-implementation over those bodies of
:func:`cellactors.persistence.history.restore.restore`: list and plan in one step, fetch every body
in the next, list again when something listed is gone, then one seal per step).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import event as hypothesis_event
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from cellactors.core import acquire, keys, lease_rules, restore_plan
from cellactors.core.acks import AckGate
from cellactors.errors import SealLost
from cellactors.persistence.control.leases import LeaseStore, NodeLease
from cellactors.persistence.control.ownership import OwnershipStore
from cellactors.persistence.history.restore import MAX_LISTINGS
from cellactors.persistence.history.seals import create_seal, read_seal
from cellactors.persistence.history.snapshots import collect_garbage
from cellactors.persistence.store.bucket import (
    Applied,
    Bucket,
    CasResult,
    Guard,
    Match,
    ObjectInfo,
    StoredObject,
)
from cellactors.persistence.store.memory import MemoryBucket

CELL = "Model:one"
ROOT = keys.cell_root(CELL)
TTL_MS = 10_000
SNAPSHOT_EVERY = 2  # txids since the last snapshot before a node's progress snapshots
NODE_IDS = ("n1", "n2", "n3")
LAG_MS = 8_000  # how long a lagging store's listings hide a new object
MAX_LAG_LISTINGS = 40  # a restore waiting for a lagging listing gives up after so many


class LaggingBucket(MemoryBucket):
    """The model's store: a memory bucket that remembers when (model time) each object
    was written, so that a lagging listing can leave out the recent ones."""

    def __init__(self, now: Callable[[], int]) -> None:
        super().__init__("model")
        self.now = now
        self.written: dict[str, int] = {}

    def put(self, key: str, body: bytes) -> str:
        token = super().put(key, body)
        self.written[key] = self.now()
        return token

    def put_cas(self, key: str, body: bytes, guard: Guard) -> CasResult:
        result = super().put_cas(key, body, guard)
        if isinstance(result, Applied):
            self.written[key] = self.now()
        return result


@dataclass(frozen=True)
class Response:
    """A held response: a write (txid, value) or a read-only call that saw ``seen``."""

    kind: str
    txid: int
    value: int = 0
    seen: tuple[int, ...] = ()


@dataclass
class Upload:
    node: str
    epoch: int
    first: int
    last: int
    key: str
    body: bytes
    landed: bool = False


@dataclass
class SnapshotJob:
    """One snapshot of an activation: the upload, then (owner work) the collection."""

    node: str
    epoch: int
    txid: int
    key: str
    body: bytes
    landed: bool = False
    stage: str = "upload"  # upload (check not yet run) | deleting | done
    doomed: list[str] = field(default_factory=list)


@dataclass
class Restore:
    """An activation's restore: listings so far, the plan, and the state it rebuilt."""

    listings: int = 0
    floor: int = 0  # the txid the release before this claim recorded
    lagged: int = 0  # listings that did not reach the floor yet
    plan: restore_plan.Plan | None = None
    state: list[int] = field(default_factory=list)
    to_seal: list[restore_plan.EpochStep] = field(default_factory=list)
    # Epochs whose seal this restore created after the collection had deleted the first
    # one, with another value (see do_restore_seal): its state is not the cell's history.
    recreated: list[int] = field(default_factory=list)


@dataclass(repr=False)
class Node:
    id: str
    skew_ms: int
    owner: OwnershipStore
    leases: LeaseStore
    running: bool = False
    paused: bool = False
    zombie: bool = False  # an old process of this node id, replaced while it was paused
    generation: str = ""
    lease_token: str | None = None
    deadline_s: float = 0.0
    # The cell, as this node sees it.
    phase: str = "idle"  # idle | claiming | claimed | fetching | sealing | active
    pending: acquire.Claim | None = None
    epoch: int = 0
    restore: Restore | None = None
    state: list[int] = field(default_factory=list)
    gate: AckGate[Response] = field(default_factory=AckGate)
    shipped: int = 0
    upload: Upload | None = None
    base: int = 0  # the txid the activation restored to
    snap_txid: int = 0  # the newest snapshot of the chain (restored from, or written)
    snap: SnapshotJob | None = None

    def __repr__(self) -> str:
        return f"<{self.id}{' zombie' if self.zombie else ''}>"


def event(name: str) -> None:
    """Count an interesting step in hypothesis' statistics (scripted runs skip it)."""
    if currently_in_test_context():
        hypothesis_event(name)


def encode_batch(epoch: int, txns: list[tuple[int, int]]) -> bytes:
    return json.dumps({"epoch": epoch, "txns": txns}).encode()


def decode_batch(body: bytes) -> list[tuple[int, int]]:
    return [(int(t), int(v)) for t, v in json.loads(body)["txns"]]


def encode_snapshot(epoch: int, txid: int, state: list[int]) -> bytes:
    return json.dumps({"epoch": epoch, "txid": txid, "state": state}).encode()


def decode_snapshot(body: bytes) -> tuple[int, int, list[int]]:
    value = json.loads(body)
    return int(value["epoch"]), int(value["txid"]), [int(v) for v in value["state"]]


RESTORING = ("claimed", "fetching", "sealing")


class DeferredDeletes(Bucket):
    """The real bucket, except that deletes are recorded (and issued later, one model step
    each), so :func:`collect_garbage`'s choice and ownership check run for real while its
    deletes can interleave with other nodes' steps."""

    def __init__(self, inner: Bucket) -> None:
        self.inner = inner
        self.spec = inner.spec
        self.deleted: list[str] = []

    def get(self, key: str) -> StoredObject | None:
        return self.inner.get(key)

    def head(self, key: str) -> ObjectInfo | None:
        return self.inner.head(key)

    def put(self, key: str, body: bytes) -> str:
        raise AssertionError("the collection writes nothing")

    def put_cas(self, key: str, body: bytes, guard: Guard) -> CasResult:
        raise AssertionError("the collection writes nothing")

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        return self.inner.list(prefix)

    def delete(self, key: str) -> None:
        self.deleted.append(key)


class ProtocolModel(RuleBasedStateMachine):
    #: The collection's ownership re-read may run while its snapshot upload is still in
    #: flight (the code uploads, then re-reads): a superset of the real interleavings, in
    #: which a restore can list before the snapshot lands and lose objects to the deletes.
    GC_CHECK_BEFORE_LANDING = True

    def __init__(self) -> None:
        super().__init__()
        self.now = 1_000_000  # simulated wall clock, ms
        self.bucket = LaggingBucket(lambda: self.now)
        self.lag_ms = 0  # listings hide objects written in the last lag_ms
        self.nodes: list[Node] = []
        self.values = itertools.count(1)
        self.generations = itertools.count(1)
        # Oracle.
        self.history: dict[int, tuple[int, ...]] = {}  # value -> committer's state after it
        self.acked: dict[int, tuple[int, int, str]] = {}  # txid -> (value, epoch, node)
        # epoch -> processes (node id, generation) that acknowledged a write at that epoch
        self.ackers: dict[int, set[tuple[str, str]]] = {}
        # txid -> (value, epoch): acknowledged, or restored (so sealed) by a restore at epoch.
        self.durable: dict[int, tuple[int, int]] = {}
        # (epoch, (node id, generation)) of every successful acquire
        self.claims: list[tuple[int, tuple[str, str]]] = []
        self.owner_epoch_seen = 0
        self.in_flight: list[Upload] = []  # PUTs sent and not yet landed
        self.stale_rechecks = 0
        self.snaps_in_flight: list[SnapshotJob] = []
        # Every object ever written (batches, snapshots), and every seal's max_txid, even
        # after the collection deleted it: the independent record check_restored uses.
        self.archive: dict[str, bytes] = {}
        self.seal_values: dict[int, int] = {}
        self.recreated_seals: dict[int, int] = {}  # epoch -> a deposed restore's seal
        self.relists = 0
        self.gc_check_before_landing = self.GC_CHECK_BEFORE_LANDING

    # --- helpers -------------------------------------------------------------------------

    def clock(self, n: Node) -> int:
        return self.now + n.skew_ms

    def listed(self) -> list[str]:
        """The cell's keys as a restore's listing shows them (a lagging store's omits what
        was written in the last ``lag_ms``)."""
        horizon = self.now - self.lag_ms
        return [
            info.key
            for info in self.bucket.list(ROOT)
            if not self.lag_ms or self.bucket.written.get(info.key, horizon) <= horizon
        ]

    def can_act(self, n: Node) -> bool:
        return n.running and not n.paused

    def active(self, n: Node) -> bool:
        return self.can_act(n) and n.phase == "active"

    def pick(self, data: st.DataObject, ok: Callable[[Node], bool]) -> Node:
        return data.draw(st.sampled_from([n for n in self.nodes if ok(n)]), label="node")

    def write_lease(self, n: Node, guard: Guard) -> bool:
        sent_s = self.clock(n) / 1000.0
        lease = NodeLease(
            node=n.id,
            addr=f"http://{n.id}",
            expires_ms=self.clock(n) + TTL_MS,
            generation=n.generation,
        )
        result = n.leases.cas_node_lease(guard, lease)
        if not isinstance(result, Applied):
            return False
        n.lease_token = result.token
        n.deadline_s = lease_rules.fence_deadline(sent_s, TTL_MS / 1000.0)
        return True

    def reset_cell(self, n: Node) -> None:
        """Stop the cell: fail every held response, discard the local copy."""
        n.gate.fail(RuntimeError("cell reset"))
        n.phase = "idle"
        n.pending = None
        n.restore = None
        n.state = []
        n.shipped = 0
        n.upload = None  # an upload already sent stays in self.in_flight
        n.base = n.snap_txid = 0
        n.snap = None  # cancelled: no further check or delete (a sent upload may land)

    def released(self, n: Node, out: list[Response]) -> None:
        """Responses leave the node: check the acknowledgement rule and record acks."""
        last = 0
        for resp in out:
            assert resp.txid >= last, "responses released out of order"
            last = resp.txid
            assert resp.txid <= n.gate.acked
            # No response reveals state that could still be lost.
            for txid in range(1, resp.txid + 1):
                assert txid in self.durable or (resp.kind == "w" and txid == resp.txid), (
                    f"a response needs txid {txid}, which is neither acknowledged nor sealed"
                )
            for txid, value in enumerate(resp.seen, start=1):
                assert self.durable[txid][0] == value, f"a read revealed txid {txid}={value}"
            if resp.kind == "w":
                previous = self.acked.get(resp.txid)
                assert previous is None or previous[0] == resp.value, (
                    f"txid {resp.txid} acknowledged twice with different values"
                )
                self.acked[resp.txid] = (resp.value, n.epoch, n.id)
                self.durable[resp.txid] = (resp.value, n.epoch)
                self.ackers.setdefault(n.epoch, set()).add((n.id, n.generation))
                event("write acknowledged")

    # --- setup ---------------------------------------------------------------------------

    @initialize(
        count=st.integers(2, 3),
        skews=st.lists(st.sampled_from([-1_500, 0, 0, 1_500]), min_size=3, max_size=3),
        warm=st.integers(0, 3),
        handoffs=st.integers(0, 2),
        snapshots=st.booleans(),
        lagging=st.booleans(),
    )
    def setup(
        self,
        count: int,
        skews: list[int],
        warm: int = 0,
        handoffs: int = 0,
        snapshots: bool = False,
        lagging: bool = False,
    ) -> None:
        """Start the nodes; with ``warm``, n1 already owns the cell and acknowledged that
        many writes (so that short runs start from an interesting place), then hands it to
        the next node ``handoffs`` times (each owner writing as many), each owner taking a
        snapshot and collecting before it releases when ``snapshots``. With ``lagging``, the
        store's listings lag (see the module docstring)."""
        self.lag_ms = LAG_MS if lagging else 0
        for node_id, skew in zip(NODE_IDS[:count], skews[:count], strict=True):
            n = Node(
                node_id,
                skew,
                OwnershipStore(self.bucket, node_id),
                LeaseStore(self.bucket, node_id, TTL_MS / 1000.0),
            )
            self.nodes.append(n)
            self.do_start(n)
        if not warm:
            return
        for i in range(handoffs + 1):
            owner = self.nodes[i % count]
            if i and self.lag_ms:
                self.tick(self.lag_ms)  # the listing shows the released writes by now
            for _ in range(12):
                if owner.phase == "active":
                    break
                self.advance(owner)
            for _ in range(warm):
                self.do_write(owner)
                for _ in range(3):
                    self.advance(owner)
            if snapshots:
                self.do_snapshot(owner)
                assert owner.snap is not None
                self.do_land_snapshot(owner.snap)
                self.do_gc_check(owner)
                self.do_gc_delete(owner, every=True)
            if i < handoffs:
                self.do_release(owner)
        assert len(self.acked) == warm * (handoffs + 1), self.acked

    # --- time, process life --------------------------------------------------------------

    @rule(ms=st.sampled_from([500, 3_000, 7_000, 12_000]))
    def tick(self, ms: int) -> None:
        self.now += ms

    def do_start(self, n: Node) -> None:
        if n.running or n.zombie:
            return
        n.generation = f"g{next(self.generations)}"
        current = n.leases.read_lease(n.id)
        decision = lease_rules.decide_start(current, n.generation, self.clock(n))
        if isinstance(decision, lease_rules.WaitForExpiry):
            assert current is not None and current.lease.generation != n.generation
            assert current.lease.expires_ms > self.clock(n)
            return
        if self.write_lease(n, decision.guard):
            n.running = True
            n.paused = False
            n.gate = AckGate()

    @precondition(lambda self: any(not n.running and not n.zombie for n in self.nodes))
    @rule(data=st.data())
    def restart(self, data: st.DataObject) -> None:
        self.do_start(self.pick(data, lambda n: not n.running and not n.zombie))

    def may_replace(self, n: Node) -> bool:
        return n.running and n.paused and not n.zombie

    def do_replace(self, n: Node) -> None:
        """A paused process is given up for dead and a new one starts under the same node
        id; the old one lives on as a zombie that may wake up later, mid-upload."""
        if not self.may_replace(n) or any(z.zombie for z in self.nodes):
            return
        self.nodes.append(replace(n, zombie=True))
        event("paused process replaced (zombie)")
        n.running, n.paused, n.phase, n.pending = False, False, "idle", None
        n.restore, n.state, n.gate, n.shipped, n.upload = None, [], AckGate(), 0, None
        n.base, n.snap_txid, n.snap = 0, 0, None  # the zombie keeps its snapshot job
        n.lease_token = None
        self.do_start(n)  # waits while the old process's lease is live

    @precondition(lambda self: any(self.may_replace(n) for n in self.nodes))
    @rule(data=st.data())
    def replace_paused(self, data: st.DataObject) -> None:
        self.do_replace(self.pick(data, self.may_replace))

    def do_crash(self, n: Node, lands: bool) -> None:
        """The process dies: local state gone; its lease expires on its own. An upload it
        had sent may still land later (``lands``) or be lost."""
        if not n.running:
            return
        if n.upload is not None and n.upload in self.in_flight and not lands:
            self.in_flight.remove(n.upload)
        if n.snap is not None and n.snap in self.snaps_in_flight and not lands:
            self.snaps_in_flight.remove(n.snap)
        self.reset_cell(n)
        n.running = False
        n.paused = False

    @precondition(lambda self: any(n.running for n in self.nodes))
    @rule(data=st.data(), lands=st.booleans())
    def crash(self, data: st.DataObject, lands: bool) -> None:
        self.do_crash(self.pick(data, lambda n: n.running), lands)

    @precondition(lambda self: any(n.running and not n.paused for n in self.nodes))
    @rule(data=st.data())
    def pause(self, data: st.DataObject) -> None:
        """The process stops (GC pause, SIGSTOP): no renewals, no work; sent PUTs may land."""
        self.pick(data, self.can_act).paused = True

    @precondition(lambda self: any(n.paused for n in self.nodes))
    @rule(data=st.data())
    def resume(self, data: st.DataObject) -> None:
        self.pick(data, lambda n: n.paused).paused = False

    def do_renew(self, n: Node) -> None:
        if not self.can_act(n) or n.lease_token is None:
            return
        if not self.write_lease(n, Match(n.lease_token)):
            self.fence(n)

    @precondition(lambda self: any(n.running and not n.paused for n in self.nodes))
    @rule(data=st.data())
    def renew(self, data: st.DataObject) -> None:
        self.do_renew(self.pick(data, self.can_act))

    def do_watchdog(self, n: Node) -> None:
        """The self-fence deadline check (it races the node's other work after a pause)."""
        if self.can_act(n) and lease_rules.should_fence(n.deadline_s, self.clock(n) / 1000.0):
            event("self-fence")
            self.fence(n)

    @precondition(lambda self: any(n.running and not n.paused for n in self.nodes))
    @rule(data=st.data())
    def watchdog(self, data: st.DataObject) -> None:
        self.do_watchdog(self.pick(data, self.can_act))

    def fence(self, n: Node) -> None:
        self.reset_cell(n)
        n.running = False

    # --- ownership -----------------------------------------------------------------------

    def may_acquire(self, n: Node) -> bool:
        return self.can_act(n) and n.phase in ("idle", "claiming")

    def do_acquire_read(self, n: Node) -> None:
        """Read own.json (and the owner's lease) and decide; the claim is a separate step so
        another node can move in between."""
        if not self.may_acquire(n):
            return
        record = n.owner.read_owner(CELL)
        decision = acquire.decide(n.id, record, self.clock(n))
        if isinstance(decision, acquire.ReadLease):
            snap = n.leases.read_lease(decision.node)
            decision = acquire.decide(
                n.id, record, self.clock(n), None if snap is None else snap.lease
            )
            if isinstance(decision, acquire.Claim):
                # Never steal from a live owner (by this node's clock).
                assert (
                    snap is None
                    or snap.lease.node != decision.previous_owner
                    or (not snap.lease.is_live(self.clock(n)))
                )
            if isinstance(decision, acquire.Remote):
                assert snap is not None and snap.lease.is_live(self.clock(n))
                assert record is not None and decision.node == record.node
                n.phase, n.pending = "idle", None
                return
        assert isinstance(decision, acquire.Claim)
        if self.lag_ms and record is not None and record.node:
            # Only graceful hand-offs with lagging listings: a claim from a record nobody
            # released (a takeover, or this node id again after its process or its cell
            # was lost) has no floor to wait for and restores from the listing alone.
            n.phase, n.pending = "idle", None
            return
        if decision.takeover:
            event("takeover decided")
        n.phase, n.pending = "claiming", decision

    @precondition(lambda self: any(self.may_acquire(n) for n in self.nodes))
    @rule(data=st.data())
    def acquire_read(self, data: st.DataObject) -> None:
        self.do_acquire_read(self.pick(data, self.may_acquire))

    def may_claim(self, n: Node) -> bool:
        return self.can_act(n) and n.phase == "claiming" and n.pending is not None

    def do_acquire_claim(self, n: Node) -> None:
        if not self.may_claim(n):
            return
        claim = n.pending
        assert claim is not None
        result = n.owner.cas_owner(CELL, claim.guard, claim.epoch, claim.floor)
        if not isinstance(result, Applied):
            event("claim rejected")
            n.phase, n.pending = "idle", None  # someone moved first: start again
            return
        assert acquire.confirmed(n.id, claim, n.owner.read_owner(CELL))
        # Invariant 2: every successful acquire has a higher epoch than all before.
        assert all(claim.epoch > e for e, _ in self.claims), (claim, self.claims)
        self.claims.append((claim.epoch, (n.id, n.generation)))
        n.phase, n.pending, n.epoch = "claimed", None, claim.epoch
        n.state, n.shipped, n.upload = [], 0, None
        n.restore = Restore(floor=claim.floor)

    @precondition(lambda self: any(self.may_claim(n) for n in self.nodes))
    @rule(data=st.data())
    def acquire_claim(self, data: st.DataObject) -> None:
        self.do_acquire_claim(self.pick(data, self.may_claim))

    def may_release(self, n: Node) -> bool:
        return (
            self.active(n)
            and n.gate.unacked == 0
            and n.upload is None
            and (n.snap is None or n.snap.landed)  # a snapshot upload is waited for
        )

    def do_release(self, n: Node) -> None:
        """Graceful hand-off: only with nothing unacknowledged, and after the snapshot work
        (it waits for a snapshot upload, and cancels the collection) -- before own.json."""
        if not self.may_release(n):
            return
        if n.snap is not None and n.snap.stage != "done":
            event("release cancelled the collection")
        n.snap = None
        n.owner.release_owner(CELL, n.epoch, n.gate.acked)
        self.reset_cell(n)

    @precondition(lambda self: any(self.may_release(n) for n in self.nodes))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        self.do_release(self.pick(data, self.may_release))

    # --- restore -------------------------------------------------------------------------

    def restoring(self, n: Node) -> bool:
        return self.can_act(n) and n.phase in RESTORING and n.restore is not None

    def relist(self, n: Node, why: str) -> None:
        """Something listed is gone or the plan found a hole: list again (bounded), else the
        activation fails (RestoreHole)."""
        assert n.restore is not None
        self.relists += 1
        event(f"restore lists again: {why}")
        if n.restore.listings >= MAX_LISTINGS:
            event("restore failed: a hole that stayed")
            self.reset_cell(n)
        else:
            n.phase = "claimed"

    def do_restore_list(self, n: Node) -> None:
        """List, and plan from that listing, reading the seals the plan asks for."""
        if not self.restoring(n) or n.phase != "claimed":
            return
        r = n.restore
        assert r is not None
        r.listings += 1
        listing = restore_plan.parse_listing(ROOT, self.listed())
        seals: dict[int, int] = {}
        while True:
            planned = restore_plan.plan_restore(listing, n.epoch, seals, floor=r.floor)
            if not isinstance(planned, restore_plan.NeedSeal):
                break
            value = read_seal(self.bucket, CELL, planned.epoch)
            assert value is not None, "a listed seal vanished within one step"
            seals[planned.epoch] = value
        if isinstance(planned, restore_plan.Lagging):
            # The release recorded more than the listing shows: wait for it (the runtime
            # backs off within a deadline), never seal below it.
            r.listings -= 1
            r.lagged += 1
            event("restore waits for a lagging listing")
            if r.lagged >= MAX_LAG_LISTINGS:
                event("restore failed: the listing kept lagging")
                self.reset_cell(n)
            return
        if isinstance(planned, restore_plan.Hole):
            self.relist(n, "a hole")
            return
        r.plan = planned
        n.phase = "fetching"

    def do_restore_fetch(self, n: Node) -> None:
        """Fetch the snapshot and every batch the plan reads, then apply them."""
        if not self.restoring(n) or n.phase != "fetching":
            return
        r = n.restore
        assert r is not None and r.plan is not None
        plan = r.plan
        state: list[int] = []
        if plan.snapshot is not None:
            obj = self.bucket.get(plan.snapshot.key)
            if obj is None:
                self.relist(n, "the snapshot vanished")
                return
            epoch, txid, state = decode_snapshot(obj.body)
            assert (epoch, txid) == (plan.snapshot.epoch, plan.snapshot.txid)
            assert len(state) == txid
        bodies: list[bytes] = []
        for ref in plan.reads:
            got = self.bucket.get(ref.key)
            if got is None:
                self.relist(n, "a batch vanished")
                return
            bodies.append(got.body)
        left = iter(bodies)
        for step in plan.steps:
            for ref in step.reads:
                for txid, value in decode_batch(next(left)):
                    if len(state) < txid <= step.upto:
                        assert txid == len(state) + 1, f"{ref.key}: txid {txid} out of order"
                        state.append(value)
            assert len(state) == step.upto, (step, len(state))
        assert len(state) == plan.last_txid
        r.state = state
        r.to_seal = list(plan.seals)
        n.phase = "sealing"
        if r.listings > 1:
            event("restore succeeded after listing again")
        if r.lagged:
            event("restore reached the released floor after a lagging listing")

    def do_restore_seal(self, n: Node) -> None:
        """Create the next seal the plan asks for; when none is left, open the cell."""
        if not self.restoring(n) or n.phase != "sealing":
            return
        r = n.restore
        assert r is not None
        if not r.to_seal:
            self.open_cell(n)
            return
        step = r.to_seal.pop(0)
        try:
            create_seal(self.bucket, CELL, step.epoch, step.upto, n.epoch)
        except SealLost:
            event("restore lost the seal race")
            self.reset_cell(n)  # this activation fails; the next finds the seal
            return
        previous = self.seal_values.setdefault(step.epoch, step.upto)
        if previous != step.upto:
            # The seal was created (by another restore) and collected (by a snapshot)
            # between this restore's listing and this create, which the conditional create
            # cannot see. Only a deposed activation can be that late: the collection that
            # deleted the seal ran for an owner at a later epoch than this one. The value
            # may be lower than the first seal's or higher: the first seal may have come
            # from a restore that listed before a late batch landed (a deposed one too),
            # while this one listed after. Either way the seal it leaves is never read (a
            # snapshot of a later epoch covers it) and the activation opens superseded (see
            # open_cell): what it restored is not the cell's history.
            assert max(e for e, _ in self.claims) > n.epoch, (
                f"epoch {step.epoch} sealed at {previous} was sealed again at {step.upto} by "
                f"the current activation (epoch {n.epoch})"
            )
            listing = restore_plan.parse_listing(ROOT, [i.key for i in self.bucket.list(ROOT)])
            assert any(e > step.epoch for _t, e, _k in listing.snapshots), listing.snapshots
            self.recreated_seals[step.epoch] = step.upto
            r.recreated.append(step.epoch)
            event(
                "a deposed restore re-created a collected seal "
                f"{'below' if step.upto < previous else 'above'} the first one"
            )

    def do_restore_step(self, n: Node) -> None:
        """The next step of a restore, whichever it is."""
        if n.phase == "claimed":
            self.do_restore_list(n)
        elif n.phase == "fetching":
            self.do_restore_fetch(n)
        elif n.phase == "sealing":
            self.do_restore_seal(n)

    @precondition(lambda self: any(self.restoring(n) for n in self.nodes))
    @rule(data=st.data())
    def restore_step(self, data: st.DataObject) -> None:
        self.do_restore_step(self.pick(data, self.restoring))

    def open_cell(self, n: Node) -> None:
        assert n.restore is not None and n.restore.plan is not None
        state = n.restore.state
        recreated = bool(n.restore.recreated)
        self.check_restored(n.epoch, state, n.restore.plan, recreated)
        superseded = max(e for e, _ in self.claims) > n.epoch
        if not recreated:
            # Every seal this restore relied on is the epoch's one seal (read, or created
            # first), so what it rebuilt is sealed history, superseded or not.
            for txid, value in enumerate(state, start=1):
                previous = self.durable.get(txid)
                assert previous is None or previous[0] == value, (txid, value, previous)
                if previous is None:
                    self.durable[txid] = (value, n.epoch)
        if superseded:
            # A later activation claimed the cell while this one restored. In the runtime
            # that takes this node's lease to have run out in the eyes of the node that took
            # over (or of the new process of this node id, which waited for it), so this
            # node is past its fence deadline (docs/protocol.md, "Clocks"): it never renews
            # again, and its watchdog or its first call fences it before it answers
            # anything. Nor does it snapshot: the runtime snapshots only after an
            # acknowledgement, which the re-read of own.json refuses it. The model fences it
            # here. (The model's node may still be within its deadline: it may renew late,
            # standing in for renewals made in time, which the runtime never does after the
            # deadline; or its skew may put its clock further from the claimant's than the
            # fence margin, outside the clock assumption, where the docs concede that a
            # deposed node may answer a stale read.) This matters for a restore that
            # re-created a collected seal: its state may hold an unacknowledged tail that
            # the cell's history dropped, and is never recorded as durable.
            if lease_rules.should_fence(n.deadline_s, self.clock(n) / 1000.0):
                event("a superseded restore opened past its node's deadline")
            else:
                event("a superseded restore opened within its deadline (late renewal, skew)")
            if recreated:
                event("a restore that re-created a collected seal opened, superseded")
            self.fence(n)
            return
        assert not recreated, "a restore that re-created a collected seal was not superseded"
        snapshot = n.restore.plan.snapshot
        n.state = list(state)
        n.restore = None
        n.gate = AckGate(acked=len(state))
        n.shipped = n.base = len(state)
        n.snap_txid = snapshot.txid if snapshot else 0
        n.upload = None
        n.snap = None
        n.phase = "active"
        event(f"restore at epoch {min(n.epoch, 4)}{'+' if n.epoch >= 4 else ''}")
        event(f"restored {min(len(state), 3)}{'+' if len(state) >= 3 else ''} txids")
        if snapshot is not None:
            event("restored from a snapshot")

    def check_restored(
        self, epoch: int, state: list[int], plan: restore_plan.Plan, recreated: bool = False
    ) -> None:
        """What a restore guarantees. ``recreated``: it re-created a collected seal with
        another value, so it is superseded and its state need not be the cell's history
        (its node fences before it answers): only Invariants 3 and 4 hold, and Invariant 5
        against its own plan."""
        # Invariant 3: every write acknowledged at an earlier epoch is present. (A write at
        # an earlier epoch acknowledged after this claim would be a violation of its own.)
        for txid, (value, ack_epoch, node) in sorted(self.acked.items()):
            if ack_epoch < epoch:
                assert txid <= len(state) and state[txid - 1] == value, (
                    f"acknowledged txid {txid}={value} (epoch {ack_epoch}, {node}) lost "
                    f"by the restore at epoch {epoch}: {state}"
                )
        # ...and so is everything an earlier restore found sealed.
        for txid, (value, restored_at) in sorted(self.durable.items()):
            if restored_at < epoch and not recreated:
                assert txid <= len(state) and state[txid - 1] == value, (
                    f"sealed txid {txid}={value} (restored at epoch {restored_at}) lost by "
                    f"the restore at epoch {epoch}: {state}"
                )
        # Invariant 4: the restored state is exactly a history some node committed: every
        # write is wholly there or wholly absent, and histories never mix.
        if state:
            assert tuple(state) == self.history[state[-1]], (state, self.history[state[-1]])
        # Invariant 5: the state is the one after the last sealed transaction, computed
        # independently: every seal as it was first written (the collection may have deleted
        # it since) and every batch ever uploaded.
        seals: list[int] = []
        for e in range(1, epoch):
            assert e in self.seal_values, f"epoch {e} is unsealed after a restore at {epoch}"
            in_bucket = read_seal(self.bucket, CELL, e)
            assert in_bucket in (None, self.seal_values[e], self.recreated_seals.get(e))
            seals.append(self.seal_values[e])
        image: list[int] | None = None
        if plan.snapshot is not None:
            snap_epoch, txid, image = decode_snapshot(self.archive[plan.snapshot.key])
            assert (snap_epoch, txid) == (plan.snapshot.epoch, plan.snapshot.txid)
            assert plan.snapshot.epoch < epoch
        if recreated:
            # Measured against its own plan instead: the snapshot it chose, then each
            # epoch's txids as its plan took them, every one from a batch of that epoch.
            expected = list(image or [])
            for step in plan.steps:
                found = self.archived_txids(step.epoch)
                for txid in range(step.after + 1, step.upto + 1):
                    assert len(found.get(txid, ())) == 1, (step, txid, found)
                    expected.append(next(iter(found[txid])))
            assert state == expected, (state, expected)
            return
        assert seals == sorted(seals), f"seals go backwards: {seals}"
        assert len(state) == (seals[-1] if seals else 0), (
            state,
            seals,
            plan,
            sorted(i.key[len(ROOT) :] for i in self.bucket.list(ROOT)),
        )
        expected = []
        low = 0
        for e, high in enumerate(seals, start=1):
            found = self.archived_txids(e)
            for txid in range(low + 1, high + 1):
                assert len(found.get(txid, ())) == 1, (e, txid, found)
                expected.append(next(iter(found[txid])))
            low = high
        assert state == expected, (state, expected)
        # A restore from a snapshot (GC may have removed the epochs below it): the snapshot
        # holds exactly that prefix of the sealed history, and the rest came from batches.
        if image is not None:
            assert image == expected[: len(image)], (image, expected)

    def archived_txids(self, epoch: int) -> dict[int, set[int]]:
        """txid -> values in every batch ever uploaded to ``epoch`` (collected or not)."""
        found: dict[int, set[int]] = {}
        folder = keys.epoch_dir(CELL, epoch)
        for key, body in self.archive.items():
            if key.startswith(folder):
                for txid, value in decode_batch(body):
                    found.setdefault(txid, set()).add(value)
        return found

    # --- writes --------------------------------------------------------------------------

    def do_write(self, n: Node) -> None:
        """A write call commits locally; its response is held."""
        if not self.active(n):
            return
        txid = len(n.state) + 1
        value = next(self.values)
        n.state.append(value)
        self.history[value] = tuple(n.state)
        n.gate.commit(txid)
        self.released(n, n.gate.hold(Response("w", txid, value)))

    @precondition(lambda self: any(self.active(n) for n in self.nodes))
    @rule(data=st.data())
    def write(self, data: st.DataObject) -> None:
        self.do_write(self.pick(data, self.active))

    def do_read(self, n: Node) -> None:
        """A read-only call: 0 bucket requests, but waits for every earlier commit."""
        if not self.active(n):
            return
        self.released(n, n.gate.hold(Response("r", n.gate.committed, seen=tuple(n.state))))

    @precondition(lambda self: any(self.active(n) for n in self.nodes))
    @rule(data=st.data())
    def read(self, data: st.DataObject) -> None:
        self.do_read(self.pick(data, self.active))

    def may_ship(self, n: Node) -> bool:
        return self.active(n) and n.upload is None and n.shipped < len(n.state)

    def do_ship(self, n: Node) -> None:
        """The replicator sends every unshipped transaction in one PUT (group commit)."""
        if not self.may_ship(n):
            return
        first, last = n.shipped + 1, len(n.state)
        body = encode_batch(n.epoch, [(t, n.state[t - 1]) for t in range(first, last + 1)])
        key = keys.batch_key(CELL, n.epoch, first, last)
        n.upload = Upload(n.id, n.epoch, first, last, key, body)
        n.shipped = last
        self.in_flight.append(n.upload)

    @precondition(lambda self: any(self.may_ship(n) for n in self.nodes))
    @rule(data=st.data())
    def ship(self, data: st.DataObject) -> None:
        self.do_ship(self.pick(data, self.may_ship))

    def do_land(self, upload: Upload) -> None:
        """A sent PUT reaches the store, whatever its node is doing now (paused, crashed,
        replaced)."""
        self.in_flight.remove(upload)
        self.bucket.put(upload.key, upload.body)
        assert self.archive.setdefault(upload.key, upload.body) == upload.body
        upload.landed = True

    def may_retry(self, n: Node) -> bool:
        return self.active(n) and n.upload is not None and not n.upload.landed

    def do_retry(self, n: Node) -> None:
        """The PUT could not be proven in time: send again from the same first txid with
        whatever was committed since. The first attempt may still land (overlap)."""
        if not self.may_retry(n):
            return
        assert n.upload is not None
        first, last = n.upload.first, len(n.state)
        body = encode_batch(n.epoch, [(t, n.state[t - 1]) for t in range(first, last + 1)])
        key = keys.batch_key(CELL, n.epoch, first, last)
        n.upload = Upload(n.id, n.epoch, first, last, key, body)
        n.shipped = last
        self.in_flight.append(n.upload)
        event("upload retried")

    @precondition(lambda self: any(self.may_retry(n) for n in self.nodes))
    @rule(data=st.data())
    def retry(self, data: st.DataObject) -> None:
        self.do_retry(self.pick(data, self.may_retry))

    @precondition(lambda self: bool(self.in_flight))
    @rule(data=st.data())
    def land(self, data: st.DataObject) -> None:
        self.do_land(data.draw(st.sampled_from(self.in_flight), label="upload"))

    def may_recheck(self, n: Node) -> bool:
        return self.active(n) and n.upload is not None and n.upload.landed

    def do_recheck(self, n: Node) -> None:
        """After the PUT: re-read own.json; acknowledge only if it still names us at E."""
        if not self.may_recheck(n):
            return
        upload = n.upload
        assert upload is not None
        record = n.owner.read_owner(CELL)
        if record is not None and record.node == n.id and record.epoch == n.epoch:
            n.upload = None
            self.released(n, n.gate.ack(upload.last))
        else:
            self.stale_rechecks += 1
            if n.zombie:
                event("zombie's re-read failed")
            event("re-read found another owner: write failed")
            self.reset_cell(n)

    @precondition(lambda self: any(self.may_recheck(n) for n in self.nodes))
    @rule(data=st.data())
    def recheck(self, data: st.DataObject) -> None:
        self.do_recheck(self.pick(data, self.may_recheck))

    # --- snapshots and their collection (owner work) -----------------------------------

    def snapshot_range(self, n: Node) -> range:
        """Txids this activation may snapshot: acknowledged, not below its restore, beyond
        the chain's last snapshot."""
        return range(max(n.base, n.snap_txid + 1, 1), n.gate.acked + 1)

    def snap_busy(self, n: Node) -> bool:
        """Snapshot work of this activation is still going (its upload, or its collection)."""
        return n.snap is not None and not (n.snap.stage == "done" and n.snap.landed)

    def may_snapshot(self, n: Node) -> bool:
        # The runtime takes a snapshot only after an upload of this activation was
        # acknowledged (the replicator asks for one after an acknowledgement), so only an
        # activation that owned the cell after its restore ever snapshots.
        return (
            self.active(n)
            and n.gate.acked > n.base
            and not self.snap_busy(n)
            and len(self.snapshot_range(n)) > 0
        )

    def do_snapshot(self, n: Node, txid: int | None = None) -> None:
        """Upload a snapshot of acknowledged state (off the ack path; it may land late)."""
        if not self.may_snapshot(n):
            return
        txid = self.snapshot_range(n)[-1] if txid is None else txid
        assert txid in self.snapshot_range(n)
        image = n.state[:txid]
        for t, value in enumerate(image, start=1):
            assert self.durable[t][0] == value, f"a snapshot of txid {t} that is not durable"
        key = keys.snapshot_key(CELL, txid, n.epoch)
        n.snap = SnapshotJob(n.id, n.epoch, txid, key, encode_snapshot(n.epoch, txid, image))
        n.snap_txid = txid
        self.snaps_in_flight.append(n.snap)

    @precondition(lambda self: any(self.may_snapshot(n) for n in self.nodes))
    @rule(data=st.data())
    def snapshot(self, data: st.DataObject) -> None:
        n = self.pick(data, self.may_snapshot)
        self.do_snapshot(n, data.draw(st.sampled_from(self.snapshot_range(n)), label="txid"))

    def do_land_snapshot(self, job: SnapshotJob) -> None:
        """A snapshot upload reaches the store, whatever its node is doing now."""
        self.snaps_in_flight.remove(job)
        self.bucket.put(job.key, job.body)
        assert self.archive.setdefault(job.key, job.body) == job.body
        job.landed = True

    @precondition(lambda self: bool(self.snaps_in_flight))
    @rule(data=st.data())
    def land_snapshot(self, data: st.DataObject) -> None:
        self.do_land_snapshot(data.draw(st.sampled_from(self.snaps_in_flight), label="snap"))

    def may_gc_check(self, n: Node) -> bool:
        job = n.snap
        return (
            self.can_act(n)
            and job is not None
            and job.stage == "upload"
            and (job.landed or self.gc_check_before_landing)
        )

    def do_gc_check(self, n: Node) -> None:
        """The collection lists what the snapshot covers and re-reads own.json (the real
        :func:`collect_garbage`); its deletes are the node's next steps."""
        if not self.may_gc_check(n):
            return
        job = n.snap
        assert job is not None
        owner = n.owner

        def owns() -> bool:
            record = owner.read_owner(CELL)
            return record is not None and (record.node, record.epoch) == (job.node, job.epoch)

        deferred = DeferredDeletes(self.bucket)
        collect_garbage(deferred, CELL, job.epoch, job.txid, owns=owns)
        job.doomed = deferred.deleted
        job.stage = "deleting" if job.doomed else "done"
        if not job.doomed and not owns():
            event("collection skipped: own.json names another owner")
        if job.doomed and not job.landed:
            event("collection checked before its snapshot landed")

    @precondition(lambda self: any(self.may_gc_check(n) for n in self.nodes))
    @rule(data=st.data())
    def gc_check(self, data: st.DataObject) -> None:
        self.do_gc_check(self.pick(data, self.may_gc_check))

    def may_gc_delete(self, n: Node) -> bool:
        job = n.snap
        return self.can_act(n) and job is not None and job.stage == "deleting" and job.landed

    def do_gc_delete(self, n: Node, every: bool = False) -> None:
        """Delete the next object the collection chose (or all of them)."""
        if not self.may_gc_delete(n):
            return
        job = n.snap
        assert job is not None
        record = n.owner.read_owner(CELL)  # the model's look, not the node's
        if record is None or (record.node, record.epoch) != (job.node, job.epoch):
            event("collection deletes after a takeover")
        while job.doomed:
            self.bucket.delete(job.doomed.pop(0))
            if not every:
                break
        if not job.doomed:
            job.stage = "done"

    @precondition(lambda self: any(self.may_gc_delete(n) for n in self.nodes))
    @rule(data=st.data(), every=st.booleans())
    def gc_delete(self, data: st.DataObject, every: bool) -> None:
        self.do_gc_delete(self.pick(data, self.may_gc_delete), every)

    def stalled_collector(self, n: Node) -> bool:
        return n.running and n.paused and n.snap is not None and n.snap.stage == "deleting"

    @precondition(lambda self: any(self.stalled_collector(n) for n in self.nodes))
    @rule(data=st.data(), every=st.booleans())
    def collector_wakes(self, data: st.DataObject, every: bool) -> None:
        """A node paused after its collection's ownership check resumes and deletes at once
        (before its watchdog runs), whoever owns the cell now."""
        n = self.pick(data, self.stalled_collector)
        n.paused = False
        assert n.snap is not None
        if not n.snap.landed and n.snap in self.snaps_in_flight:
            self.do_land_snapshot(n.snap)
        self.do_gc_delete(n, every)

    @precondition(
        lambda self: (
            any(self.stalled_collector(n) for n in self.nodes)
            and any(self.can_act(n) for n in self.nodes)
        )
    )
    @rule(data=st.data(), every=st.booleans())
    def takeover_races_collection(self, data: st.DataObject, every: bool) -> None:
        """The race of the acknowledged-write loss: a node lists for its restore while an
        owner is stalled after its collection's ownership check; the owner wakes and deletes
        before the restore fetches."""
        b = self.pick(data, self.stalled_collector)
        a = self.pick(data, self.can_act)
        for _ in range(8):
            if not self.can_act(a) or a.phase not in ("idle", "claiming", "claimed"):
                break
            self.advance(a)
        b.paused = False
        assert b.snap is not None
        if b.snap in self.snaps_in_flight:
            self.do_land_snapshot(b.snap)
        self.do_gc_delete(b, every)
        for _ in range(8):
            if not self.can_act(a) or a.phase not in RESTORING:
                break
            self.advance(a)

    @precondition(lambda self: any(self.may_snapshot(n) for n in self.nodes))
    @rule(data=st.data())
    def snapshot_cycle(self, data: st.DataObject) -> None:
        """A whole snapshot at once: upload, land, check, delete."""
        n = self.pick(data, self.may_snapshot)
        self.do_snapshot(n)
        assert n.snap is not None
        self.do_land_snapshot(n.snap)
        self.do_gc_check(n)
        self.do_gc_delete(n, every=True)

    # --- progress: the next natural steps of one node, so that runs get somewhere ---------

    def advance(self, n: Node) -> None:
        if n.zombie and n.paused:
            n.paused = False  # the zombie wakes up
        elif not n.running:
            self.do_start(n)
        elif n.phase in ("idle", "claiming") and n.pending is None:
            self.do_acquire_read(n)
        elif n.phase == "claiming":
            self.do_acquire_claim(n)
        elif n.phase in RESTORING:
            self.do_restore_step(n)
        elif n.upload is not None and n.upload.landed:
            self.do_recheck(n)
        elif n.snap is not None and n.snap in self.snaps_in_flight:
            self.do_land_snapshot(n.snap)
        elif self.may_gc_check(n):
            self.do_gc_check(n)
        elif self.may_gc_delete(n):
            self.do_gc_delete(n)
        elif n.upload is None and n.shipped < len(n.state):
            self.do_ship(n)
        elif n.upload is not None and n.upload in self.in_flight:
            self.do_land(n.upload)
        elif self.may_snapshot(n) and n.gate.acked - n.snap_txid >= SNAPSHOT_EVERY:
            self.do_snapshot(n)  # the snapshot policy: the chain since the last one is long
        else:
            self.do_write(n)

    @precondition(lambda self: any(n.running for n in self.nodes))
    @rule(data=st.data(), how=st.sampled_from(["pause", "crash", "crash-lost", "replace"]))
    def outage(self, data: st.DataObject, how: str) -> None:
        """A node pauses or dies and stays away long enough for its lease to expire."""
        n = self.pick(data, lambda n: n.running)
        if how in ("pause", "replace"):
            n.paused = True
        else:
            self.do_crash(n, lands=how == "crash")
        self.tick(12_000)
        if how == "replace":
            self.do_replace(n)

    @precondition(lambda self: any(self.active(n) for n in self.nodes))
    @rule(data=st.data(), lands=st.booleans(), replaced=st.booleans())
    def owner_stalls_mid_collection(self, data: st.DataObject, lands: bool, replaced: bool) -> None:
        """An owner acknowledges one more write, snapshots, passes its collection's ownership
        check (its snapshot landed, or -- when the model allows -- still in flight), and
        stalls past its TTL (or is replaced): its deletes are still to come."""
        n = self.pick(data, self.active)
        if not self.may_snapshot(n) and not self.snap_busy(n) and n.upload is None:
            self.do_write(n)
            self.do_ship(n)
            assert n.upload is not None
            self.do_land(n.upload)
            self.do_recheck(n)
        if not self.may_snapshot(n):
            return
        self.do_snapshot(n)
        assert n.snap is not None
        if lands or not self.gc_check_before_landing:
            self.do_land_snapshot(n.snap)
        self.do_gc_check(n)
        event(f"owner stalls mid-collection: {n.snap.stage}")
        n.paused = True
        self.tick(12_000)
        if replaced:
            self.do_replace(n)

    @rule(data=st.data(), times=st.integers(1, 8))
    def progress(self, data: st.DataObject, times: int) -> None:
        n = data.draw(st.sampled_from(self.nodes), label="node")
        for _ in range(times):
            self.advance(n)

    # --- invariants ----------------------------------------------------------------------

    @invariant()
    def one_acknowledger_per_epoch(self) -> None:
        # Invariant 1, and the acknowledger is the node that acquired that epoch.
        owners = dict(self.claims)
        for epoch, nodes in self.ackers.items():
            assert len(nodes) == 1, (epoch, nodes)
            assert nodes == {owners[epoch]}, (epoch, nodes, owners)

    @invariant()
    def owner_epoch_never_decreases(self) -> None:
        # Invariant 2 as the store shows it.
        if not self.nodes:
            return
        record = self.nodes[0].owner.read_owner(CELL)
        epoch = 0 if record is None else record.epoch
        assert epoch >= self.owner_epoch_seen
        self.owner_epoch_seen = epoch

    @invariant()
    def bucket_restores_every_durable_write(self) -> None:
        """At every moment (mid-collection too), a restore at the next epoch would plan
        without a hole and rebuild every acknowledged or sealed write."""
        if not self.claims:
            return
        current = max(e for e, _ in self.claims) + 1
        listing = restore_plan.parse_listing(ROOT, [i.key for i in self.bucket.list(ROOT)])
        seals: dict[int, int] = {}
        while isinstance(
            planned := restore_plan.plan_restore(listing, current, seals), restore_plan.NeedSeal
        ):
            value = read_seal(self.bucket, CELL, planned.epoch)
            assert value is not None
            seals[planned.epoch] = value
        assert isinstance(planned, restore_plan.Plan), f"the bucket has a hole: {planned}"
        state: list[int] = []
        if planned.snapshot is not None:
            obj = self.bucket.get(planned.snapshot.key)
            assert obj is not None
            state = decode_snapshot(obj.body)[2]
        for step in planned.steps:
            for ref in step.reads:
                obj = self.bucket.get(ref.key)
                assert obj is not None
                for txid, value in decode_batch(obj.body):
                    if len(state) < txid <= step.upto:
                        state.append(value)
        for txid, (value, _) in self.durable.items():
            assert txid <= len(state) and state[txid - 1] == value, (txid, value, state)
        if state:
            assert tuple(state) == self.history[state[-1]], (state, self.history[state[-1]])

    @invariant()
    def durable_writes_form_a_prefix(self) -> None:
        assert sorted(self.durable) == list(range(1, len(self.durable) + 1))

    @invariant()
    def local_state_extends_every_acknowledged_write(self) -> None:
        """An active node at the newest epoch holds every acknowledged write."""
        if not self.claims:
            return
        newest = max(e for e, _ in self.claims)
        for n in self.nodes:
            if n.phase == "active" and n.epoch == newest:
                for txid, (value, _) in self.durable.items():
                    assert n.state[txid - 1] == value


ProtocolModel.TestCase.settings = settings(
    max_examples=1000,
    stateful_step_count=80,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
# A thousand runs take half a minute: once per tox run (``tox -e fleet``), not per Python.
TestProtocolModel = pytest.mark.slow(ProtocolModel.TestCase)


# --- scripted scenarios: the interesting interleavings, deterministically ------------------


def fresh(count: int = 2) -> tuple[ProtocolModel, list[Node]]:
    model = ProtocolModel()
    model.setup(count=count, skews=[0, 0, 0])
    return model, model.nodes


def activate(m: ProtocolModel, n: Node) -> None:
    m.do_acquire_read(n)
    m.do_acquire_claim(n)
    while n.phase in RESTORING:
        m.do_restore_step(n)
    assert n.phase == "active"


def replicate(m: ProtocolModel, n: Node) -> None:
    m.do_ship(n)
    assert n.upload is not None
    m.do_land(n.upload)
    m.do_recheck(n)


def test_scenario_write_is_acknowledged_and_survives_takeover() -> None:
    m, (n1, n2) = fresh()
    activate(m, n1)
    m.do_write(n1)
    replicate(m, n1)
    assert m.acked == {1: (1, 1, "n1")}
    m.do_crash(n1, lands=False)
    m.tick(12_000)
    m.do_renew(n2)
    activate(m, n2)
    assert n2.epoch == 2 and n2.state == [1]
    m.one_acknowledger_per_epoch()


def test_scenario_group_commit_one_put_for_many_writes() -> None:
    m, (n1, _) = fresh()
    activate(m, n1)
    m.do_write(n1)
    m.do_ship(n1)  # txid 1 in flight
    for _ in range(5):
        m.do_write(n1)
        m.do_read(n1)
    assert n1.upload is not None
    m.do_land(n1.upload)
    m.do_recheck(n1)  # releases txid 1 only: the rest wait for their own upload
    assert sorted(m.acked) == [1]
    replicate(m, n1)  # txids 2..6 in one PUT
    assert sorted(m.acked) == [1, 2, 3, 4, 5, 6]
    batches = [i.key for i in m.bucket.list(keys.epoch_dir(CELL, 1))]
    assert batches == [keys.batch_key(CELL, 1, 1, 1), keys.batch_key(CELL, 1, 2, 6)]


def test_scenario_paused_upload_lands_after_takeover() -> None:
    """n1 is paused with an upload in flight; n2 takes over and seals n1's epoch; the late
    batch lands, n1 resumes and its re-read fails the write: never acknowledged, and later
    restores ignore it."""
    m, (n1, n2) = fresh()
    activate(m, n1)
    m.do_write(n1)
    replicate(m, n1)  # txid 1 acknowledged
    m.do_write(n1)
    m.do_ship(n1)  # txid 2 in flight
    late = n1.upload
    assert late is not None
    n1.paused = True
    m.tick(12_000)
    m.do_renew(n2)
    activate(m, n2)  # epoch 2 seals epoch 1 at txid 1
    assert n2.state == [1]
    m.do_land(late)  # n1's txid 2 lands in e1 after the seal
    n1.paused = False
    m.do_recheck(n1)  # sees n2 at epoch 2: fails, resets
    assert m.stale_rechecks == 1 and n1.phase == "idle"
    assert 2 not in m.acked
    m.do_write(n2)
    replicate(m, n2)
    assert m.acked[2][2] == "n2"
    m.do_crash(n2, lands=True)
    m.tick(12_000)
    m.do_watchdog(n1)  # n1's lease ran out while it was paused: it fences itself
    assert not n1.running
    m.do_start(n1)
    activate(m, n1)  # epoch 3: e1 sealed at 1, e2 chain to 2
    assert n1.epoch == 3
    assert n1.state == [1, m.acked[2][0]]


def test_scenario_restore_loses_the_seal_race() -> None:
    """n2 claims epoch 2 and lists, then pauses; n3 takes over at epoch 3 and seals epoch 1
    including a late (unacknowledged, but whole) batch; n2's seal create is rejected and its
    activation fails."""
    m, (n1, n2, n3) = fresh(3)
    activate(m, n1)
    m.do_write(n1)
    replicate(m, n1)
    m.do_write(n1)
    m.do_ship(n1)  # txid 2 in flight
    late = n1.upload
    assert late is not None
    m.do_crash(n1, lands=True)
    m.tick(12_000)
    m.do_renew(n2)
    m.do_renew(n3)
    m.do_acquire_read(n2)
    m.do_acquire_claim(n2)
    m.do_restore_list(n2)  # sees e1 with txid 1 only
    m.do_land(late)  # the dead node's txid 2 lands now
    n2.paused = True
    m.tick(12_000)
    m.do_renew(n3)
    activate(m, n3)  # epoch 3: e1 chain reaches 2, e2 is empty
    assert n3.state == [1, 2]
    n2.paused = False
    m.do_restore_fetch(n2)
    m.do_restore_seal(n2)  # the seal of e1 exists already: SealLost
    assert n2.phase == "idle"
    # Sealed is durable: a read on the new owner goes at once.
    out = n3.gate.hold(Response("r", n3.gate.committed))
    assert len(out) == 1
    m.released(n3, out)


def test_scenario_remote_while_owner_live() -> None:
    m, (n1, n2) = fresh()
    activate(m, n1)
    m.do_acquire_read(n2)
    assert n2.phase == "idle" and n2.pending is None
    m.tick(12_000)
    m.do_acquire_read(n2)
    assert n2.phase == "claiming"
    assert n2.pending is not None and n2.pending.takeover


def test_scenario_two_claims_race() -> None:
    m, (n1, n2) = fresh()
    m.do_acquire_read(n1)
    m.do_acquire_read(n2)
    m.do_acquire_claim(n1)
    m.do_acquire_claim(n2)  # same guard (absent): rejected
    assert n1.phase == "claimed" and n2.phase == "idle"
    assert m.claims == [(1, ("n1", n1.generation))]


def test_scenario_release_then_reacquire_elsewhere() -> None:
    m, (n1, n2) = fresh()
    activate(m, n1)
    m.do_write(n1)
    replicate(m, n1)
    m.do_release(n1)
    activate(m, n2)  # released: no lease read, no wait
    assert n2.epoch == 2 and n2.state == [1]


def test_scenario_a_lagging_listing_after_a_release_waits_for_the_released_txid() -> None:
    """The listing hides the batch n1 acknowledged just before its release: n2's restore
    neither seals nor opens until the listing shows txid 1 (without the floor the release
    recorded it would seal epoch 1 empty, losing the write for good)."""
    m = ProtocolModel()
    m.setup(count=2, skews=[0, 0, 0], lagging=True)
    n1, n2 = m.nodes
    activate(m, n1)
    m.do_write(n1)
    replicate(m, n1)
    m.do_release(n1)
    m.do_acquire_read(n2)
    m.do_acquire_claim(n2)
    m.do_restore_step(n2)
    assert n2.phase == "claimed" and n2.restore is not None and n2.restore.lagged == 1
    assert read_seal(m.bucket, CELL, 1) is None  # nothing sealed below the released txid
    m.tick(LAG_MS)
    while n2.phase in RESTORING:
        m.do_restore_step(n2)
    assert n2.phase == "active" and n2.state == [1]
    assert read_seal(m.bucket, CELL, 1) == 1


def test_scenario_zombie_of_the_same_node_id_cannot_acknowledge() -> None:
    """n1 pauses mid-upload and is replaced by a new process under the same node id, which
    re-acquires the cell (own.json names n1, so no lease wait is needed for the cell). The
    zombie's upload lands and it wakes: own.json still names n1, but at a later epoch, so the
    write must fail."""
    m, (n1, _) = fresh()
    activate(m, n1)
    m.do_write(n1)
    replicate(m, n1)
    m.do_write(n1)
    m.do_ship(n1)
    late = n1.upload
    assert late is not None
    n1.paused = True
    m.tick(12_000)
    m.do_replace(n1)
    zombie = m.nodes[-1]
    assert zombie.zombie and zombie.epoch == 1 and zombie.upload is late
    assert n1.running and n1.generation != zombie.generation
    activate(m, n1)  # epoch 2, same node id
    assert n1.epoch == 2 and n1.state == [1]
    m.do_land(late)
    zombie.paused = False
    m.do_recheck(zombie)
    assert zombie.phase == "idle" and 2 not in m.acked
    m.do_write(n1)
    replicate(m, n1)
    assert m.acked[2][1:] == (2, "n1")
    m.one_acknowledger_per_epoch()


def test_scenario_retried_upload_overlaps() -> None:
    """An upload that could not be proven is sent again with more transactions; both
    objects land; the restore reads each txid once."""
    m, (n1, n2) = fresh()
    activate(m, n1)
    m.do_write(n1)
    m.do_ship(n1)
    first = n1.upload
    assert first is not None
    m.do_write(n1)
    m.do_retry(n1)  # 1..2
    assert n1.upload is not None and (n1.upload.first, n1.upload.last) == (1, 2)
    m.do_land(n1.upload)
    m.do_recheck(n1)
    assert sorted(m.acked) == [1, 2]
    m.do_land(first)  # the first attempt (1..1) lands late
    m.do_crash(n1, lands=False)
    m.tick(12_000)
    m.do_renew(n2)
    activate(m, n2)
    assert n2.state == [m.acked[1][0], m.acked[2][0]]


# --- scripted scenarios: snapshots and their collection ------------------------------------


def write_acked(m: ProtocolModel, n: Node, times: int = 1) -> None:
    for _ in range(times):
        m.do_write(n)
        replicate(m, n)


def bucket_keys(m: ProtocolModel) -> set[str]:
    return {info.key for info in m.bucket.list(ROOT)}


def acked_values(m: ProtocolModel) -> list[int]:
    return [m.acked[t][0] for t in sorted(m.acked)]


def snapshot_and_collect(m: ProtocolModel, n: Node) -> SnapshotJob:
    m.do_snapshot(n)
    job = n.snap
    assert job is not None
    m.do_land_snapshot(job)
    m.do_gc_check(n)
    m.do_gc_delete(n, every=True)
    assert job.stage == "done"
    return job


def history_until_collection(m: ProtocolModel) -> tuple[Node, Node, Node, SnapshotJob]:
    """n1 (epoch 1) acknowledges txids 1-2, snapshots S0 at 2 and releases; n2 (epoch 2)
    restores from S0, acknowledges 3-4 and starts a snapshot S1 at 4 (in flight)."""
    n1, n2, n3 = m.nodes
    activate(m, n1)
    write_acked(m, n1, 2)
    s0 = snapshot_and_collect(m, n1)
    m.do_release(n1)
    activate(m, n2)
    assert n2.epoch == 2 and n2.snap_txid == 2  # restored from S0
    write_acked(m, n2, 2)
    m.do_snapshot(n2)
    assert n2.snap is not None and n2.snap.txid == 4
    return n2, n3, n1, s0


def test_scenario_collection_deletes_what_a_takeover_restore_listed() -> None:
    """The race of the acknowledged-write loss, in the variant the fixed protocol still
    allows (release waits for snapshot work, so B is paused instead): B's collection passed
    its ownership check with its snapshot S1 in flight; B stalls past its TTL; A takes over
    and lists (S1 not there yet: A plans from the older S0); S1 lands and B deletes S0 and
    epoch 1. A's fetch finds S0 gone, lists again, and restores from S1: every write."""
    m, _ = fresh(3)
    b, a, _n1, s0 = history_until_collection(m)
    s1 = b.snap
    assert s1 is not None
    m.do_gc_check(b)  # own.json still names B at epoch 2
    assert s1.stage == "deleting" and not s1.landed
    assert set(s1.doomed) == {
        keys.batch_key(CELL, 1, 1, 1),
        keys.batch_key(CELL, 1, 2, 2),
        keys.seal_key(CELL, 1),
        s0.key,
    }
    b.paused = True
    m.tick(12_000)
    m.do_renew(a)
    m.do_acquire_read(a)
    m.do_acquire_claim(a)
    assert a.epoch == 3
    m.do_restore_list(a)
    assert a.restore is not None and a.restore.plan is not None
    assert a.restore.plan.snapshot is not None and a.restore.plan.snapshot.key == s0.key
    m.do_land_snapshot(s1)
    b.paused = False  # before its watchdog fences it
    m.do_gc_delete(b, every=True)
    assert s0.key not in bucket_keys(m)
    m.do_restore_fetch(a)  # S0 is gone: list again
    assert a.phase == "claimed" and m.relists == 1
    while a.phase in RESTORING:
        m.do_restore_step(a)
    assert a.phase == "active"
    assert a.state == acked_values(m) and len(a.state) == 4
    assert a.snap_txid == 4  # restored from S1
    m.bucket_restores_every_durable_write()


def test_scenario_collection_after_its_upload_never_touches_a_takeover_restore() -> None:
    """In the code's order (upload, then the ownership check), a restore that lists after
    the check sees the new snapshot, so the stalled owner's deletes never hit its reads."""
    m, _ = fresh(3)
    b, a, _n1, s0 = history_until_collection(m)
    s1 = b.snap
    assert s1 is not None
    m.do_land_snapshot(s1)
    m.do_gc_check(b)
    assert s1.stage == "deleting"
    b.paused = True
    m.tick(12_000)
    m.do_renew(a)
    m.do_acquire_read(a)
    m.do_acquire_claim(a)
    m.do_restore_list(a)
    assert a.restore is not None and a.restore.plan is not None
    assert a.restore.plan.snapshot is not None and a.restore.plan.snapshot.key == s1.key
    b.paused = False
    m.do_gc_delete(b, every=True)
    assert s0.key not in bucket_keys(m)
    activate_rest(m, a)
    assert m.relists == 0 and a.state == acked_values(m)


def activate_rest(m: ProtocolModel, n: Node) -> None:
    while n.phase in RESTORING:
        m.do_restore_step(n)
    assert n.phase == "active"


def test_scenario_late_snapshot_from_a_zombie() -> None:
    """n1 pauses with a snapshot upload in flight and is replaced; the new process takes the
    cell at epoch 2 and writes on. The zombie's snapshot lands late; the zombie wakes, its
    collection re-reads own.json (n1, but epoch 2) and deletes nothing. A later restore may
    use the late snapshot: it stands for acknowledged state, within epoch 1's seal."""
    m, (n1, n2) = fresh()
    activate(m, n1)
    write_acked(m, n1, 2)
    m.do_snapshot(n1)
    late = n1.snap
    assert late is not None and not late.landed
    n1.paused = True
    m.tick(12_000)
    m.do_replace(n1)
    zombie = m.nodes[-1]
    assert zombie.zombie and zombie.snap is late
    activate(m, n1)  # epoch 2: restores the chain, seals epoch 1 at 2
    assert n1.epoch == 2
    write_acked(m, n1)
    before = bucket_keys(m)
    m.do_land_snapshot(late)
    zombie.paused = False
    m.do_gc_check(zombie)
    assert late.stage == "done" and bucket_keys(m) == before | {late.key}
    m.do_crash(n1, lands=True)
    m.tick(12_000)
    m.do_renew(n2)
    activate(m, n2)  # epoch 3: reads epoch 1's seal, uses the late snapshot
    assert n2.epoch == 3 and n2.snap_txid == 2
    assert n2.state == acked_values(m) and len(n2.state) == 3


def test_scenario_collection_skipped_after_a_takeover() -> None:
    """The owner's snapshot lands, then it stalls before its collection's ownership check;
    another node takes over. The check re-reads own.json, sees the new owner, and nothing is
    deleted."""
    m, _ = fresh(3)
    b, a, _n1, _s0 = history_until_collection(m)
    s1 = b.snap
    assert s1 is not None
    m.do_land_snapshot(s1)
    b.paused = True
    m.tick(12_000)
    m.do_renew(a)
    activate(m, a)
    assert a.epoch == 3 and a.state == acked_values(m)
    before = bucket_keys(m)
    b.paused = False
    m.do_gc_check(b)
    assert s1.stage == "done" and s1.doomed == []
    assert bucket_keys(m) == before
    # ...and the new owner's own collection deletes everything below its epoch.
    write_acked(m, a)
    job = snapshot_and_collect(m, a)
    assert [k for k in bucket_keys(m) if k.endswith(".snap")] == [job.key]
    assert not [k for k in bucket_keys(m) if "/e1" in k or "/e2" in k]


def test_scenario_release_waits_for_the_snapshot_upload() -> None:
    m, (n1, n2) = fresh()
    activate(m, n1)
    write_acked(m, n1, 2)
    m.do_snapshot(n1)
    assert n1.snap is not None
    assert not m.may_release(n1)  # the upload is in flight
    m.do_land_snapshot(n1.snap)
    assert m.may_release(n1)
    m.do_release(n1)  # cancels the collection that has not run
    assert n1.snap is None and n1.phase == "idle"
    activate(m, n2)
    assert n2.state == acked_values(m)


def test_scenario_deposed_restore_recreates_a_collected_seal() -> None:
    """A design limit, harmless: n2 lists and fetches at epoch 2, then stalls before its
    seals; n3 takes over, seals epoch 1 higher (a late batch landed), acknowledges a write,
    snapshots and collects epochs 1-2 with their seals. n2's conditional create of epoch 1's
    seal succeeds (the seal is gone), below the snapshot that covers it: no later restore
    reads it. n2's activation opens superseded and its node, past its lease deadline, fences
    before it answers anything."""
    m, (n1, n2, n3) = fresh(3)
    activate(m, n1)
    write_acked(m, n1, 2)
    m.do_write(n1)
    m.do_ship(n1)  # txid 3 in flight
    late = n1.upload
    assert late is not None
    m.do_crash(n1, lands=True)
    m.tick(12_000)
    m.do_renew(n2)
    m.do_renew(n3)
    m.do_acquire_read(n2)
    m.do_acquire_claim(n2)
    m.do_restore_list(n2)
    m.do_restore_fetch(n2)  # e1 through txid 2
    assert n2.phase == "sealing"
    n2.paused = True
    m.do_land(late)
    m.tick(12_000)
    m.do_renew(n3)
    activate(m, n3)  # epoch 3: seals e1 at 3 (the late batch is whole), e2 at 3
    assert n3.state[:2] == acked_values(m) and len(n3.state) == 3
    write_acked(m, n3)  # txid 4: a snapshot follows an acknowledgement
    snapshot_and_collect(m, n3)
    assert keys.seal_key(CELL, 1) not in bucket_keys(m)
    n2.paused = False
    while n2.phase in RESTORING:
        m.do_restore_step(n2)  # re-creates e1's seal at 2, opens superseded
    assert read_seal(m.bucket, CELL, 1) == 2 and m.seal_values[1] == 3
    assert m.recreated_seals == {1: 2}
    assert not n2.running and n2.phase == "idle"  # fenced: it never answers
    assert m.durable[3] == (n3.state[2], 3)  # its restore counted for nothing
    m.bucket_restores_every_durable_write()


def test_scenario_deposed_restore_recreates_a_seal_above_the_first() -> None:
    """Found by the state machine. The first seal of an epoch may come from a restore that
    listed before a late batch landed, and a deposed restore that listed after it re-creates
    the seal *higher* once a collection deleted it. n1 crashes with txid 1 in flight; n2
    claims epoch 2, lists (nothing) and stalls; the late batch lands; n3 takes over at epoch
    3, lists it and stalls; n2 seals epoch 1 at 0 first and opens superseded (its node
    fences); n1, restarted, takes over at epoch 4: epoch 1's seal puts the late batch beyond
    history. It acknowledges its own txid 1, snapshots and collects. n3 then re-creates epoch
    1's seal at 1 and opens with the late, never acknowledged txid 1: superseded, its node
    fences, and nothing it restored counts. Every later restore starts from the snapshot."""
    m, (n1, n2, n3) = fresh(3)
    activate(m, n1)
    m.do_write(n1)
    m.do_ship(n1)  # txid 1 in flight
    late = n1.upload
    assert late is not None
    m.do_crash(n1, lands=True)
    m.tick(12_000)
    m.do_renew(n2)
    m.do_renew(n3)
    m.do_acquire_read(n2)
    m.do_acquire_claim(n2)
    m.do_restore_list(n2)
    m.do_restore_fetch(n2)  # epoch 1 is empty: seal it at 0
    n2.paused = True
    m.do_land(late)
    m.tick(12_000)
    m.do_renew(n3)
    m.do_acquire_read(n3)
    m.do_acquire_claim(n3)
    assert n3.epoch == 3
    m.do_restore_list(n3)
    m.do_restore_fetch(n3)  # epoch 1 through the late txid 1
    assert n3.phase == "sealing" and n3.restore is not None and n3.restore.state == [1]
    n3.paused = True
    n2.paused = False
    while n2.phase in RESTORING:
        m.do_restore_step(n2)
    assert read_seal(m.bucket, CELL, 1) == 0
    assert not n2.running  # superseded by n3, past its deadline: fenced
    m.tick(12_000)
    m.do_start(n1)
    activate(m, n1)  # epoch 4: e1 sealed at 0 (the late batch lies beyond), e2, e3 at 0
    assert n1.epoch == 4 and n1.state == []
    write_acked(m, n1)
    snapshot_and_collect(m, n1)
    assert keys.seal_key(CELL, 1) not in bucket_keys(m)
    n3.paused = False
    while n3.phase in RESTORING:
        m.do_restore_step(n3)
    assert read_seal(m.bucket, CELL, 1) == 1 and m.seal_values[1] == 0  # above the first
    assert not n3.running and n3.phase == "idle"
    assert m.durable == {1: (n1.state[0], 4)}
    m.bucket_restores_every_durable_write()
    m.do_release(n1)
    m.do_start(n2)
    activate(m, n2)  # epoch 5: from n1's snapshot
    assert n2.state == acked_values(m) and len(n2.state) == 1


def test_scenario_superseded_restore_after_a_collection() -> None:
    m, (n1, n2, n3) = fresh(3)
    activate(m, n1)
    write_acked(m, n1, 2)
    m.do_crash(n1, lands=True)
    m.tick(12_000)
    m.do_renew(n2)
    m.do_renew(n3)
    m.do_acquire_read(n2)
    m.do_acquire_claim(n2)
    assert n2.epoch == 2 and n2.phase == "claimed"
    n2.paused = True
    m.tick(12_000)
    m.do_renew(n3)
    activate(m, n3)
    write_acked(m, n3)
    snapshot_and_collect(m, n3)
    n2.paused = False
    while n2.phase in RESTORING:
        m.do_restore_step(n2)
    # The listing shows epoch 3's snapshot: a later activation superseded n2's, which fails
    # instead of sealing the collected epochs at txid 0 and opening empty.
    assert n2.phase == "idle"
    assert read_seal(m.bucket, CELL, 1) is None  # nothing re-sealed below the snapshot
