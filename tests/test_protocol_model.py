"""A model of the fleet protocol over the pure core (PROTOCOL.md, "Invariants").

No threads, no real store, no SQLite: two or three simulated nodes (plus at most one zombie:
an old process of a node id, replaced while paused) share one :class:`MemoryBucket` and one
simulated wall clock (each node reads it with its own skew).
Each node keeps its cell's committed values in a list (txid i is ``state[i - 1]``), the epoch
it believes it owns and an :class:`AckGate`. Every protocol step is its own rule, so
hypothesis interleaves them: a claim can race another node's claim, a restore can be paused
between its listing and its seals, and an upload can land long after its node was paused,
crashed or replaced.

What is real: the ownership and lease stores, the decision functions of
:mod:`cellactors.core`, the seal create/read of :mod:`cellactors.persistence.restore` and the
key layout. What is simulated: batch bodies (JSON ``{"epoch", "txns": [[txid, value]]}``),
time, and the restore executor (a re-implementation over those bodies that follows the plan
of :mod:`cellactors.core.restore_plan` one epoch per step).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace

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

from cellactors.core import acquire, lease_rules, restore_plan
from cellactors.core.acks import AckGate
from cellactors.persistence import keys
from cellactors.persistence.bucket import Applied, Guard, Match
from cellactors.persistence.leases import LeaseStore, NodeLease
from cellactors.persistence.memory import MemoryBucket
from cellactors.persistence.ownership import OwnershipStore
from cellactors.persistence.restore import SealLost, create_seal, read_seal

CELL = "Model:one"
ROOT = keys.cell_root(CELL)
TTL_MS = 10_000
NODE_IDS = ("n1", "n2", "n3")


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
class Restore:
    listing: restore_plan.Listing
    epochs: list[int]
    state: list[int] = field(default_factory=list)


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
    phase: str = "idle"  # idle | claiming | claimed | restoring | active
    pending: acquire.Claim | None = None
    epoch: int = 0
    restore: Restore | None = None
    state: list[int] = field(default_factory=list)
    gate: AckGate[Response] = field(default_factory=AckGate)
    shipped: int = 0
    upload: Upload | None = None

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


class ProtocolModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.bucket = MemoryBucket("model")
        self.now = 1_000_000  # simulated wall clock, ms
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

    # --- helpers -------------------------------------------------------------------------

    def clock(self, n: Node) -> int:
        return self.now + n.skew_ms

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
    )
    def setup(self, count: int, skews: list[int], warm: int = 0) -> None:
        """Start the nodes; with ``warm``, n1 already owns the cell and acknowledged that
        many writes (so that short runs start from an interesting place)."""
        for node_id, skew in zip(NODE_IDS[:count], skews[:count], strict=True):
            n = Node(
                node_id,
                skew,
                OwnershipStore(self.bucket, node_id),
                LeaseStore(self.bucket, node_id, TTL_MS / 1000.0),
            )
            self.nodes.append(n)
            self.do_start(n)
        if warm:
            first = self.nodes[0]
            for _ in range(4):
                self.advance(first)
            for _ in range(warm):
                self.do_write(first)
                for _ in range(3):
                    self.advance(first)
            assert len(self.acked) == warm, self.acked

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
        result = n.owner.cas_owner(CELL, claim.guard, claim.epoch)
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

    @precondition(lambda self: any(self.may_claim(n) for n in self.nodes))
    @rule(data=st.data())
    def acquire_claim(self, data: st.DataObject) -> None:
        self.do_acquire_claim(self.pick(data, self.may_claim))

    def may_release(self, n: Node) -> bool:
        return self.active(n) and n.gate.unacked == 0 and n.upload is None

    def do_release(self, n: Node) -> None:
        """Graceful hand-off: only with nothing unacknowledged."""
        if not self.may_release(n):
            return
        n.owner.release_owner(CELL, n.epoch)
        self.reset_cell(n)

    @precondition(lambda self: any(self.may_release(n) for n in self.nodes))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        self.do_release(self.pick(data, self.may_release))

    # --- restore -------------------------------------------------------------------------

    def do_restore_list(self, n: Node) -> None:
        if not self.can_act(n) or n.phase != "claimed":
            return
        listed = [info.key for info in self.bucket.list(ROOT)]
        listing = restore_plan.parse_listing(ROOT, listed)
        epochs = restore_plan.epochs_to_restore(listing, 1, n.epoch)
        n.restore = Restore(listing, epochs)
        n.phase = "restoring"

    @precondition(lambda self: any(self.can_act(n) and n.phase == "claimed" for n in self.nodes))
    @rule(data=st.data())
    def restore_list(self, data: st.DataObject) -> None:
        self.do_restore_list(self.pick(data, lambda n: self.can_act(n) and n.phase == "claimed"))

    def do_restore_step(self, n: Node) -> None:
        """One epoch of the restore loop (or, when none is left, open the cell)."""
        if not self.can_act(n) or n.phase != "restoring" or n.restore is None:
            return
        r = n.restore
        if not r.epochs:
            self.open_cell(n)
            return
        e = r.epochs.pop(0)
        after = len(r.state)
        seal_max: int | None = None
        if e in r.listing.seals:
            if not restore_plan.needs_seal_read(r.listing, e, after):
                return
            seal_max = read_seal(self.bucket, CELL, e)
            assert seal_max is not None, "a listed seal vanished"
        step = restore_plan.plan_epoch(r.listing, e, after, seal_max)
        assert step.epoch == e and step.after == after
        for ref in step.reads:
            obj = self.bucket.get(ref.key)
            assert obj is not None, f"{ref.key} vanished"
            for txid, value in decode_batch(obj.body):
                if len(r.state) < txid <= step.upto:
                    assert txid == len(r.state) + 1, f"{ref.key}: txid {txid} out of order"
                    r.state.append(value)
        assert len(r.state) == step.upto, (step, len(r.state))
        if step.seal:
            try:
                create_seal(self.bucket, CELL, e, len(r.state), n.epoch)
            except SealLost:
                event("restore lost the seal race")
                self.reset_cell(n)  # this activation fails; the next finds the seal

    @precondition(lambda self: any(self.can_act(n) and n.phase == "restoring" for n in self.nodes))
    @rule(data=st.data())
    def restore_step(self, data: st.DataObject) -> None:
        self.do_restore_step(self.pick(data, lambda n: self.can_act(n) and n.phase == "restoring"))

    def open_cell(self, n: Node) -> None:
        assert n.restore is not None
        state = n.restore.state
        self.check_restored(n.epoch, state)
        for txid, value in enumerate(state, start=1):
            previous = self.durable.get(txid)
            assert previous is None or previous[0] == value, (txid, value, previous)
            if previous is None:
                self.durable[txid] = (value, n.epoch)
        n.state = list(state)
        n.restore = None
        n.gate = AckGate(acked=len(state))
        n.shipped = len(state)
        n.upload = None
        n.phase = "active"
        event(f"restore at epoch {min(n.epoch, 4)}{'+' if n.epoch >= 4 else ''}")
        event(f"restored {min(len(state), 3)}{'+' if len(state) >= 3 else ''} txids")

    def check_restored(self, epoch: int, state: list[int]) -> None:
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
            if restored_at < epoch:
                assert txid <= len(state) and state[txid - 1] == value, (
                    f"sealed txid {txid}={value} (restored at epoch {restored_at}) lost by "
                    f"the restore at epoch {epoch}: {state}"
                )
        # Invariant 4: the restored state is exactly a history some node committed: every
        # write is wholly there or wholly absent, and histories never mix.
        if state:
            assert tuple(state) == self.history[state[-1]], (state, self.history[state[-1]])
        # Invariant 5: the state is the one after the last sealed transaction, computed
        # independently from the seals and batches now in the bucket.
        seals: list[int] = []
        for e in range(1, epoch):
            seal = read_seal(self.bucket, CELL, e)
            assert seal is not None, f"epoch {e} is unsealed after a restore at {epoch}"
            seals.append(seal)
        assert seals == sorted(seals), f"seals go backwards: {seals}"
        assert len(state) == (seals[-1] if seals else 0), (state, seals)
        expected: list[int] = []
        low = 0
        for e, high in enumerate(seals, start=1):
            found: dict[int, set[int]] = {}
            for info in self.bucket.list(keys.epoch_dir(CELL, e)):
                obj = self.bucket.get(info.key)
                assert obj is not None
                for txid, value in decode_batch(obj.body):
                    found.setdefault(txid, set()).add(value)
            for txid in range(low + 1, high + 1):
                assert len(found.get(txid, ())) == 1, (e, txid, found)
                expected.append(next(iter(found[txid])))
            low = high
        assert state == expected, (state, expected)

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
        elif n.phase == "claimed":
            self.do_restore_list(n)
        elif n.phase == "restoring":
            self.do_restore_step(n)
        elif n.upload is not None and n.upload.landed:
            self.do_recheck(n)
        elif n.upload is None and n.shipped < len(n.state):
            self.do_ship(n)
        elif n.upload is not None and n.upload in self.in_flight:
            self.do_land(n.upload)
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
    max_examples=400,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestProtocolModel = ProtocolModel.TestCase


# --- scripted scenarios: the interesting interleavings, deterministically ------------------


def fresh(count: int = 2) -> tuple[ProtocolModel, list[Node]]:
    model = ProtocolModel()
    model.setup(count=count, skews=[0, 0, 0])
    return model, model.nodes


def activate(m: ProtocolModel, n: Node) -> None:
    m.do_acquire_read(n)
    m.do_acquire_claim(n)
    m.do_restore_list(n)
    while n.phase == "restoring":
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
    m.do_restore_step(n2)  # the seal of e1 exists already: SealLost
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
