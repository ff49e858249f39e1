"""The cell runtime against a real SeaweedFS: operation counts, fencing, leases,
passivation, snapshots and the user API."""

from __future__ import annotations

import queue
import threading
import time
from collections import Counter as Tally
from typing import Any, cast

import pytest

from cellactors import Node
from cellactors.actors.node.calls import await_answer
from cellactors.actors.replicator import SnapshotPolicy
from cellactors.core import keys
from cellactors.errors import (
    BadResult,
    MethodFailed,
    NotDurable,
    RemoteOwner,
    UnknownCell,
    UnknownMethod,
)
from cellactors.persistence.history.seals import read_seal
from cellactors.persistence.store.bucket import Bucket
from cellactors.persistence.store.s3 import S3Bucket
from tests.helpers.buckets import CuttableBucket, HangingBucket, delta
from tests.helpers.cells import Counter
from tests.helpers.runtime import (
    TTL,
    active_of,
    cell_dump,
    crash,
    eventually,
    expire_lease,
    host_of,
    make_node,
    owner_epoch,
)

CELL = "Counter:a"


def test_read_on_active_cell_makes_no_request(sw_bucket: S3Bucket) -> None:
    node = make_node(sw_bucket, "n1")
    try:
        cell = node.cell(Counter, "a")
        cell.increment("x")
        before = node.bucket.snapshot()
        assert cell.get("x") == 1
        assert delta(node, before) == Tally()
    finally:
        node.stop()


def test_lone_write_is_one_put_and_one_owner_get(sw_bucket: S3Bucket) -> None:
    node = make_node(sw_bucket, "n1")
    try:
        cell = node.cell(Counter, "a")
        cell.increment("x")
        before = node.bucket.snapshot()
        assert cell.increment("x") == 2
        assert delta(node, before) == Tally({("put", "batch"): 1, ("get", "own"): 1})
    finally:
        node.stop()


def test_a_never_owned_cell_activates_without_listing_or_sealing(sw_bucket: S3Bucket) -> None:
    """The claim that creates ``own.json`` proves the cell has no history: its first call
    costs the read before the claim, the create, and one batch PUT (on_activate's schema and
    the write together) with its re-read; no listing, no seal (it was 7: a LIST, and a PUT and
    re-read of on_activate's own batch)."""
    node = make_node(sw_bucket, "n1")
    try:
        before = node.bucket.snapshot()
        assert node.cell(Counter, "fresh").increment("x") == 1
        assert delta(node, before) == Tally(
            {("get", "own"): 2, ("put_cas", "own"): 1, ("put", "batch"): 1}
        )
        assert node.state()["cells"][0]["restored_from"] == "new"
        # A cell that existed is restored from the bucket as ever (a takeover, a restart).
        node.passivate("Counter:fresh")
        other = make_node(sw_bucket, "n2")
        try:
            assert other.cell(Counter, "fresh").increment("x") == 2
            assert other.state()["cells"][0]["restored_from"] == "bucket"
        finally:
            other.stop()
    finally:
        node.stop()


def test_a_released_cell_activates_with_five_requests(sw_bucket: S3Bucket) -> None:
    """What bench row 6 counts: a cell with one write, released, then read on a fresh node
    costs the claim (the read of own.json and its conditional PUT), the listing, the GET of
    its one batch (schema and first write ship together) and the seal of the released
    epoch; the read itself writes nothing."""
    node = make_node(sw_bucket, "w1")
    try:
        node.cell(Counter, "once").increment("x")
    finally:
        node.stop()  # releases the cell
    other = make_node(sw_bucket, "r1")
    try:
        before = other.bucket.snapshot()
        assert other.cell(Counter, "once").get("x") == 1
        assert delta(other, before) == Tally(
            {
                ("get", "own"): 1,
                ("put_cas", "own"): 1,
                ("list", "other"): 1,
                ("get", "batch"): 1,
                ("put_cas", "seal"): 1,
            }
        )
        assert other.state()["cells"][0]["restored_from"] == "bucket"
    finally:
        other.stop()


def test_64_concurrent_writes_share_at_most_8_puts(sw_bucket: S3Bucket) -> None:
    # "Concurrent" means all 64 are in flight at once. Released by a barrier alone, the
    # writers can trickle in over many uploads on a loaded machine (a CI run once counted 13
    # PUTs); so the first upload is held until the cell has committed all 64, as a slow PUT
    # would hold it, and group commit must then ship the rest together.
    store = HangingBucket(sw_bucket)
    node = make_node(store, "n1")
    try:
        cell = node.cell(Counter, "a")
        cell.increment("warm")
        host = host_of(node, CELL)
        assert host.active is not None
        channel = host.active.runtime.channel
        start = channel.committed
        store.hang = True
        barrier = threading.Barrier(64)
        results: list[int] = []

        def writer() -> None:
            barrier.wait()
            results.append(cell.increment("x"))

        before = node.bucket.snapshot()
        threads = [threading.Thread(target=writer) for _ in range(64)]
        for t in threads:
            t.start()
        eventually(lambda: channel.committed == start + 64)
        assert results == []  # nothing answered before its batch was durable
        store.release.set()
        for t in threads:
            t.join()
        ops = delta(node, before)
        assert sorted(results) == list(range(1, 65))
        assert ops[("put", "batch")] <= 8
        assert ops[("get", "own")] == ops[("put", "batch")]
    finally:
        store.release.set()
        node.stop()


def test_idle_node_makes_only_lease_renewals(sw_bucket: S3Bucket) -> None:
    node = make_node(sw_bucket, "n1")
    try:
        node.cell(Counter, "a").increment("x")
        lease = node.lease.proxy()
        # Count between two completed renewals: exactly the two renewals in between, nothing
        # else (the bench reports the rate per idle second).
        first = lease.renewals.get()
        eventually(lambda: lease.renewals.get() > first, timeout=10)
        start, before = lease.renewals.get(), node.bucket.snapshot()
        eventually(lambda: lease.renewals.get() >= start + 2, timeout=10)
        after = node.bucket.snapshot()
        after.subtract(before)
        assert {k: v for k, v in after.items() if v} == {("put_cas", "lease"): 2}
    finally:
        node.stop()


def test_method_error_rolls_back_and_reports(sw_bucket: S3Bucket) -> None:
    node = make_node(sw_bucket, "n1")
    try:
        cell = node.cell(Counter, "a")
        with pytest.raises(MethodFailed) as info:
            cell.fail_after_write("x")
        assert info.value.exc_type == "ValueError"
        with pytest.raises(BadResult):
            cell.bad_result("x")
        with pytest.raises(UnknownMethod):
            cell.no_such_method()
        with pytest.raises(UnknownCell):
            node.call("Nope", "a", "get", {"name": "x"})
        assert cell.get("x") == 0
    finally:
        node.stop()


def test_virtual_tables_are_refused_at_first_write(sw_bucket: S3Bucket) -> None:
    node = make_node(sw_bucket, "n1")
    try:
        with pytest.raises(MethodFailed, match="virtual tables are not replicated"):
            node.call("Sandbox", "s", "make_vtable", {})
    finally:
        node.stop()


def test_live_owner_is_never_stolen_from(sw_bucket: S3Bucket) -> None:
    a = make_node(sw_bucket, "na")
    b = make_node(sw_bucket, "nb")
    try:
        a.cell(Counter, "a").increment("x")
        with pytest.raises(RemoteOwner) as info:
            b.cell(Counter, "a").get("x")
        assert info.value.node == "na"
        assert owner_epoch(a, CELL) == ("na", 1)
    finally:
        a.stop()
        b.stop()


def test_fenced_owner_never_acknowledges_and_its_late_batches_stay_out(sw_bucket: S3Bucket) -> None:
    a = make_node(sw_bucket, "na")
    b = make_node(sw_bucket, "nb")
    c = make_node(sw_bucket, "nc")
    try:
        ca = a.cell(Counter, "a")
        acked = [ca.increment("x") for _ in range(5)]
        assert acked == [1, 2, 3, 4, 5]
        a.lease.proxy().pause().get()  # A is "paused": it stops renewing and watching
        expire_lease(sw_bucket, "na")  # ... for longer than its TTL
        # B takes over once A's lease has expired by B's clock.
        assert eventually(lambda: b.cell(Counter, "a").get("x")) == 5
        assert owner_epoch(b, CELL) == ("nb", 2)
        # A still believes it owns the cell: its write commits locally, uploads into e1,
        # but the re-read shows B, so it is never acknowledged.
        with pytest.raises(NotDurable, match="ownership lost"):
            ca.increment("x")
        late = [i.key for i in sw_bucket.list(keys.epoch_dir(CELL, 1))]
        assert any(k.endswith("0000000000000007.batch") for k in late)  # txid 1 is on_activate
        assert read_seal(sw_bucket, CELL, 1) == 6
        assert b.cell(Counter, "a").increment("x") == 6
        b.drain()
        # C restores at epoch 3: A's late txid 7 of epoch 1 is excluded by the seal.
        assert c.cell(Counter, "a").get("x") == 6
        assert owner_epoch(c, CELL) == ("nc", 3)
    finally:
        for n in (a, b, c):
            n.stop()


def test_losing_the_store_self_fences_within_ttl(sw_bucket: S3Bucket) -> None:
    cut = CuttableBucket(sw_bucket)
    fenced = threading.Event()
    node = make_node(cut, "n1")
    node.on_fence = lambda reason: fenced.set()
    try:
        cell = node.cell(Counter, "a")
        cell.increment("x")
        started = time.monotonic()
        cut.cut = True
        assert fenced.wait(TTL + 1)
        # Before the lease it last wrote can expire for peers (TTL after that renewal's send).
        assert time.monotonic() - started < TTL
        assert node.status == "fenced"
        assert "deadline" in (node.fence_reason or "")
    finally:
        node.stop()


def test_identity_conflict_waits_for_expiry(sw_bucket: S3Bucket) -> None:
    first = make_node(sw_bucket, "same")
    from cellactors import NodeSettings

    second = Node(sw_bucket, "same", [Counter], NodeSettings(lease_ttl=TTL, advertise="x:1"))
    started = threading.Event()

    def run() -> None:
        second.start()
        started.set()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    assert not started.wait(1.2)  # first is live and renewing: second waits
    first.drain()  # expires the lease
    assert started.wait(5)
    snap = second.leases.read_lease("same")
    assert snap is not None and snap.lease.generation == second.generation
    second.stop()
    first.stop()


def test_passivation_reuses_provably_current_local_copy(sw_bucket: S3Bucket) -> None:
    node = make_node(sw_bucket, "n1", idle_timeout=0.3)
    try:
        cell = node.cell(Counter, "a")
        assert cell.increment("x") == 1
        eventually(lambda: owner_epoch(node, CELL) == ("", 1), timeout=5)
        eventually(lambda: node.activations.local_copy(CELL) is not None, timeout=5)
        assert cell.increment("x") == 2
        assert node.state()["cells"][0]["restored_from"] == "local"
        assert owner_epoch(node, CELL) == ("n1", 2)
        assert read_seal(sw_bucket, CELL, 1) == 2  # txid 1 created the table
    finally:
        node.stop()


def test_snapshots_bound_restore_and_gc_only_covered_epochs(sw_bucket: S3Bucket) -> None:
    a = make_node(sw_bucket, "na", snapshots=SnapshotPolicy(every_txids=5, retain_s=0))
    try:
        ca = a.cell(Counter, "a")
        for _ in range(12):
            ca.increment("x")
        a.drain()
        b = make_node(sw_bucket, "nb", snapshots=SnapshotPolicy(every_txids=5, retain_s=0))
        cb = b.cell(Counter, "a")
        for _ in range(12):
            cb.increment("x")

        def collected() -> bool:  # snapshots and collection run in the background
            listing = [i.key for i in sw_bucket.list(keys.cell_root(CELL))]
            snaps = [k for k in listing if "/snap/" in k]
            return (
                len(snaps) == 1  # older snapshots collected
                and ".e2.snap" in snaps[0]
                and not any("/e1/" in k for k in listing)  # epoch 1 wholly covered
                and keys.seal_key(CELL, 1) not in listing
                and any("/e2/" in k for k in listing)  # the current epoch is never collected
            )

        eventually(collected, timeout=10)
        before = cell_dump(b, CELL)
        b.drain()
        c = make_node(sw_bucket, "nc")
        assert c.cell(Counter, "a").get("x") == 24
        assert cell_dump(c, CELL) == before
        c.stop()
        b.stop()
    finally:
        a.stop()


def test_upload_not_proven_within_the_deadline_fails_and_resets(sw_bucket: S3Bucket) -> None:
    slow = HangingBucket(sw_bucket)
    node = make_node(slow, "n1", op_deadline=1.0)
    try:
        cell = node.cell(Counter, "a")
        assert cell.increment("x") == 1
        slow.hang = True
        started = time.monotonic()
        with pytest.raises(NotDurable, match="could not be proven within 1s"):
            cell.increment("x")
        assert time.monotonic() - started < 3.0
        slow.hang = False
        slow.release.set()
        # The cell was reset: the next call activates it again from the bucket, at a new epoch.
        value = eventually(lambda: cell.get("x"))
        assert value in (1, 2)  # the unproven write is wholly present or wholly absent
        assert eventually(lambda: owner_epoch(node, CELL)[1] == 2)
        # The reset of epoch 1 must not touch epoch 2's file (each activation has its own):
        # a passivation and a reactivation from the local copy keep every acknowledged write.
        assert cell.increment("x") == value + 1
        assert node.passivate(CELL)
        assert cell.get("x") == value + 1
        assert node.state()["cells"][0]["restored_from"] == "local"
        node.drain()
        fresh = make_node(sw_bucket, "n2")
        assert fresh.cell(Counter, "a").get("x") == value + 1
        fresh.stop()
    finally:
        slow.release.set()
        node.stop()


def test_runtime_on_gcs(gcs_bucket: Bucket) -> None:
    """The same protocol on the GCS dialect (fake-gcs-server): counts and a takeover."""
    a = make_node(gcs_bucket, "ga")
    b = make_node(gcs_bucket, "gb")
    try:
        cell = a.cell(Counter, "a")
        cell.increment("x")
        before = a.bucket.snapshot()
        assert cell.increment("x") == 2
        assert delta(a, before) == Tally({("put", "batch"): 1, ("get", "own"): 1})
        crash(a, gcs_bucket)
        assert eventually(lambda: b.cell(Counter, "a").get("x")) == 2
        assert owner_epoch(b, CELL) == ("gb", 2)
    finally:
        a.stop()
        b.stop()


def test_full_node_places_unowned_cells_on_the_least_loaded_peer(sw_bucket: S3Bucket) -> None:
    a = make_node(sw_bucket, "pa", max_resident_cells=1)
    b = make_node(sw_bucket, "pb")
    c = make_node(sw_bucket, "pcc")
    try:
        a.cell(Counter, "a").increment("x")  # a is now full
        c.cell(Counter, "c1").increment("x")  # c carries one cell, b none
        for n in (b, c):  # let the renewed leases carry the new load figures
            n.lease.proxy().renew().get()
        with pytest.raises(RemoteOwner) as info:
            a.cell(Counter, "b").increment("x")
        assert info.value.node == "pb"
        assert a.ownership.read_owner("Counter:b") is None  # placement wrote nothing
        # The forwarded call is placed where it lands, even on a full node.
        assert b.call("Counter", "b", "increment", {"name": "x"}, forwarded=True) == 1
        assert a.call("Counter", "z", "increment", {"name": "x"}, forwarded=True) == 1
    finally:
        for n in (a, b, c):
            n.stop()


def test_room_counts_active_cells_only(sw_bucket: S3Bucket) -> None:
    """Placement asks ``has_room`` on every activation of an unowned cell: it answers
    without a scan while few cells are hosted, and by the active count once many are."""
    node = make_node(sw_bucket, "room")
    try:
        assert node.activations.has_room(1)
        for name in ("r1", "r2"):
            node.cell(Counter, name).increment("x")
        assert node.activations.resident_count() == 2
        assert not node.activations.has_room(2)
        assert node.activations.has_room(3)
        node.activations.put_away("Counter:r1", hibernate=False)
        assert node.activations.has_room(2)
    finally:
        node.stop()


def test_a_call_after_the_lease_deadline_fences_instead_of_answering(sw_bucket: S3Bucket) -> None:
    from cellactors.errors import NodeUnavailable

    fenced = threading.Event()
    node = make_node(sw_bucket, "n1")
    node.on_fence = lambda reason: fenced.set()
    try:
        cell = node.cell(Counter, "a")
        cell.increment("x")
        before = node.bucket.snapshot()
        # As seen by a process resumed after a long pause: the deadline is behind it, and its
        # watchdog has not run yet. Even a read must not be answered from local state.
        node.deadline.value = time.monotonic() - 1
        with pytest.raises(NodeUnavailable):
            cell.get("x")
        assert fenced.is_set() and node.status == "fenced"
        assert delta(node, before) == Tally()
    finally:
        node.stop()


def test_missing_batches_below_a_seal_fail_the_activation(sw_bucket: S3Bucket) -> None:
    from cellactors.errors import ActivationFailed

    a = make_node(sw_bucket, "na")
    cell = a.cell(Counter, "a")
    for _ in range(3):
        cell.increment("x")
    a.drain()
    b = make_node(sw_bucket, "nb")
    try:
        assert b.cell(Counter, "a").get("x") == 3  # seals epoch 1 at txid 4
        b.drain()
        sw_bucket.delete(keys.batch_key(CELL, 1, 3, 3))  # lose one acknowledged batch
        c = make_node(sw_bucket, "nc")
        with pytest.raises(ActivationFailed, match="batch objects are missing"):
            c.cell(Counter, "a").get("x")
        c.stop()
    finally:
        a.stop()
        b.stop()


def test_cell_classes_that_clash_with_the_runtime_are_refused() -> None:
    from cellactors import CellActor
    from cellactors.errors import ConfigError

    class Clashing(CellActor):
        def stop(self) -> None:
            pass

        def get(self) -> int:
            return 1

    class Empty(CellActor):
        pass

    with pytest.raises(ConfigError, match="overrides stop"):
        Clashing.check_definition()
    with pytest.raises(ConfigError, match="no public method"):
        Empty.check_definition()
    Counter.check_definition()  # a normal cell passes


def test_a_read_waits_for_the_ack_of_every_earlier_write(sw_bucket: S3Bucket) -> None:
    slow = HangingBucket(sw_bucket)
    node = make_node(slow, "n1")
    try:
        cell = node.cell(Counter, "a")
        assert cell.increment("x") == 1
        slow.hang = True
        results: dict[str, int] = {}
        wrote, read = threading.Event(), threading.Event()

        def write() -> None:
            results["write"] = cell.increment("x")
            wrote.set()

        def read_() -> None:
            results["read"] = cell.get("x")
            read.set()

        threading.Thread(target=write, daemon=True).start()
        eventually(lambda: node.state()["cells"][0]["committed_txid"] == 3)
        threading.Thread(target=read_, daemon=True).start()
        # The read ran after the write committed; it must not answer before the write is
        # durable (it would reveal state that could still be lost).
        assert not read.wait(0.5)
        slow.hang = False
        slow.release.set()
        assert wrote.wait(10) and read.wait(10)
        assert results == {"write": 2, "read": 2}
    finally:
        slow.release.set()
        node.stop()


def test_a_call_sent_as_its_cell_stops_is_routed_again_not_lost(sw_bucket: S3Bucket) -> None:
    import pykka

    from cellactors.actors.messages import Invoke
    from tests.helpers.cells import Slow

    Slow.gate = threading.Event()
    node = make_node(sw_bucket, "n1")
    node.register(Slow)
    try:
        assert node.call("Slow", "a", "get") == 2
        active = active_of(node, "Slow:a")
        assert active is not None
        threading.Thread(target=node.call, args=("Slow", "a", "hold"), daemon=True).start()
        inbox = cast(queue.Queue[Any], active.cell.actor_inbox)
        eventually(lambda: inbox.qsize() == 0)  # hold() is running
        stopper = threading.Thread(target=node.passivate, args=("Slow:a",), daemon=True)
        stopper.start()
        # The stop message is queued behind the running hold() (and nothing else is).
        eventually(lambda: inbox.qsize() == 1)
        # The send that races the stop: accepted by the still-alive actor, never handled.
        invoke = Invoke("get", (), {}, pykka.ThreadingFuture())
        active.cell.tell(invoke)
        Slow.gate.set()
        started = time.monotonic()
        delivered, _ = await_answer(invoke, active, time.monotonic() + 20)
        assert not delivered and time.monotonic() - started < 5
        stopper.join(10)
        assert node.call("Slow", "a", "get") == 2  # routed again: a new activation answers
    finally:
        Slow.gate.set()
        node.stop()


class FailsOnce(CuttableBucket):
    """The next batch PUT (``"batch"``) or ``own.json`` GET (``"own"``) fails with a store
    error, once."""

    def __init__(self, inner: Bucket) -> None:
        super().__init__(inner)
        self.armed: str | None = None

    def _fire(self, what: str) -> None:
        if self.armed == what:
            self.armed = None
            from cellactors.errors import BucketError

            raise BucketError(f"one failed {what} request (test)")

    def put(self, key, body):  # type: ignore[no-untyped-def]
        if key.endswith(".batch"):
            self._fire("batch")
        return self.inner.put(key, body)

    def get(self, key):  # type: ignore[no-untyped-def]
        if key.endswith("own.json"):
            self._fire("own")
        return self.inner.get(key)


@pytest.mark.parametrize(
    ("failing", "requests"),
    [
        # The PUT failed: it is sent again, then the re-read.
        ("batch", {("put", "batch"): 2, ("get", "own"): 1}),
        # The PUT landed and the re-read failed: only the re-read is sent again.
        ("own", {("put", "batch"): 1, ("get", "own"): 2}),
    ],
)
def test_a_store_error_in_the_upload_retries_only_the_request_that_failed(
    sw_bucket: S3Bucket, failing: str, requests: dict[tuple[str, str], int]
) -> None:
    flaky = FailsOnce(sw_bucket)
    node = make_node(flaky, "n1")
    try:
        cell = node.cell(Counter, "a")
        assert cell.increment("x") == 1
        flaky.armed = failing
        before = node.bucket.snapshot()
        assert cell.increment("x") == 2  # acknowledged despite the failure
        assert flaky.armed is None
        assert delta(node, before) == Tally(requests)
    finally:
        node.stop()


class BrokenOnceBucket(CuttableBucket):
    """The next batch upload raises an unexpected (non-store) error."""

    def __init__(self, inner: Bucket) -> None:
        super().__init__(inner)
        self.armed = False

    def put(self, key, body):  # type: ignore[no-untyped-def]
        if self.armed and key.endswith(".batch"):
            self.armed = False
            raise RuntimeError("unexpected failure inside the upload (test)")
        return self.inner.put(key, body)


def test_an_unexpected_replicator_error_fails_the_held_calls_and_resets(
    sw_bucket: S3Bucket,
) -> None:
    broken = BrokenOnceBucket(sw_bucket)
    node = make_node(broken, "n1")
    try:
        cell = node.cell(Counter, "a")
        assert cell.increment("x") == 1
        broken.armed = True
        started = time.monotonic()
        with pytest.raises(NotDurable, match="replication of Counter:a failed"):
            cell.increment("x")
        assert time.monotonic() - started < 5  # failed at once, not at the call timeout
        assert eventually(lambda: cell.increment("x")) in (2, 3)  # reset, then serving again
    finally:
        node.stop()


def test_state_reports_how_many_cells_the_open_files_limit_allows(sw_bucket: S3Bucket) -> None:
    import resource

    from cellactors.actors.limits import FDS_PER_ACTIVE_CELL, RESERVED_FDS, raise_open_files_limit

    soft, hard = raise_open_files_limit()
    assert soft == resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert hard == resource.RLIM_INFINITY or soft == hard
    node = make_node(sw_bucket, "n1")
    try:
        limits = node.state()["limits"]
        assert (
            limits["max_active_cells_by_open_files"] == (soft - RESERVED_FDS) // FDS_PER_ACTIVE_CELL
        )
        assert limits["max_resident_cells"] == node.settings.max_resident_cells
    finally:
        node.stop()
