"""OwnershipStore, LeaseStore and the fleet peer key, against SeaweedFS and fake-gcs-server."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator

import pytest

from cellactors.clock import wall_ms as now_ms
from cellactors.core import keys
from cellactors.errors import AmbiguousWrite, BucketError, InvalidCellId
from cellactors.persistence.control.leases import (
    PEER_PROTOCOL,
    LeaseStore,
    NodeLease,
    encode_lease,
)
from cellactors.persistence.control.ownership import OwnershipStore
from cellactors.persistence.control.peer_auth import ensure_peer_key
from cellactors.persistence.store.bucket import (
    Absent,
    Applied,
    Bucket,
    CasResult,
    Guard,
    Match,
    ObjectInfo,
    Rejected,
    StoredObject,
)
from cellactors.persistence.store.embedded import SeaweedServer
from tests.helpers.gcs import make_gcs_bucket
from tests.helpers.stores import make_s3_bucket

CELL = "Counter:alice"


class Spy(Bucket):
    """Delegates to a real bucket and records every call; optional hooks change behaviour."""

    def __init__(self, inner: Bucket) -> None:
        self.inner = inner
        self.spec = inner.spec
        self.calls: list[tuple[str, str]] = []
        self.aged_ms: dict[str, int] = {}  # key -> how much older listings report it
        self.before_cas: Callable[[str], None] | None = None
        self.after_cas: Callable[[str, CasResult], None] | None = None
        self._lock = threading.Lock()

    def _note(self, op: str, key: str) -> None:
        with self._lock:
            self.calls.append((op, key))

    def ops(self, op: str) -> list[str]:
        return [k for o, k in self.calls if o == op]

    def writes(self) -> list[tuple[str, str]]:
        return [(o, k) for o, k in self.calls if o in ("put", "put_cas", "delete")]

    def get(self, key: str) -> StoredObject | None:
        self._note("get", key)
        return self.inner.get(key)

    def head(self, key: str) -> ObjectInfo | None:
        self._note("head", key)
        return self.inner.head(key)

    def put(self, key: str, body: bytes) -> str:
        self._note("put", key)
        return self.inner.put(key, body)

    def put_cas(self, key: str, body: bytes, guard: Guard) -> CasResult:
        self._note("put_cas", key)
        if self.before_cas is not None:
            self.before_cas(key)
        result = self.inner.put_cas(key, body, guard)
        if self.after_cas is not None:
            self.after_cas(key, result)
        return result

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        self._note("list", prefix)
        for info in self.inner.list(prefix):
            age = self.aged_ms.get(info.key, 0)
            if age:
                info = ObjectInfo(info.key, info.token, info.size, info.last_modified_ms - age)
            yield info

    def delete(self, key: str) -> None:
        self._note("delete", key)
        self.inner.delete(key)


@pytest.fixture(params=["seaweed", "gcs"])
def bucket(request: pytest.FixtureRequest) -> Bucket:
    """A fresh bucket (under a prefix, as fleets usually are) on each real store."""
    if request.param == "seaweed":
        server: SeaweedServer = request.getfixturevalue("seaweed")
        return make_s3_bucket(server.endpoint, "fleet")
    request.getfixturevalue("fake_gcs")
    return make_gcs_bucket("fleet")


@pytest.fixture
def spy(bucket: Bucket) -> Spy:
    return Spy(bucket)


def _applied(result: CasResult) -> Applied:
    assert isinstance(result, Applied), result
    return result


# --- ownership ------------------------------------------------------------------------


def test_read_owner_absent(spy: Spy) -> None:
    assert OwnershipStore(spy, "n1").read_owner(CELL) is None
    assert spy.ops("get") == [keys.owner_key(CELL)]


def test_cas_owner_create_then_match(bucket: Bucket) -> None:
    n1 = OwnershipStore(bucket, "n1")
    first = _applied(n1.cas_owner(CELL, Absent(), 1))
    rec = n1.read_owner(CELL)
    assert rec is not None
    assert (rec.node, rec.epoch, rec.token, rec.released) == ("n1", 1, first.token, False)
    stored = bucket.get(keys.owner_key(CELL))
    assert stored is not None
    assert json.loads(stored.body) == {"node": "n1", "epoch": 1, "acked_txid": 0}

    # A second create loses, whoever tries it.
    assert isinstance(OwnershipStore(bucket, "n2").cas_owner(CELL, Absent(), 1), Rejected)

    second = _applied(n1.cas_owner(CELL, Match(first.token), 2))
    assert second.token != first.token
    # The stale token no longer guards anything, even for the same node.
    assert isinstance(n1.cas_owner(CELL, Match(first.token), 3), Rejected)
    rec = n1.read_owner(CELL)
    assert rec is not None and (rec.node, rec.epoch, rec.token) == ("n1", 2, second.token)


def test_takeover_by_match_moves_ownership(bucket: Bucket) -> None:
    n1, n2 = OwnershipStore(bucket, "n1"), OwnershipStore(bucket, "n2")
    first = _applied(n1.cas_owner(CELL, Absent(), 1))
    _applied(n2.cas_owner(CELL, Match(first.token), 2))
    rec = n1.read_owner(CELL)
    assert rec is not None and (rec.node, rec.epoch) == ("n2", 2)
    # n1 can no longer release: it is not named at its epoch.
    assert isinstance(n1.release_owner(CELL, 1, 0), Rejected)


def test_release_by_owner_at_its_epoch(bucket: Bucket) -> None:
    n1 = OwnershipStore(bucket, "n1")
    created = _applied(n1.cas_owner(CELL, Absent(), 1))
    released = _applied(n1.release_owner(CELL, 1, 17))
    rec = n1.read_owner(CELL)
    assert rec is not None
    assert (rec.node, rec.epoch, rec.released, rec.token) == ("", 1, True, released.token)
    assert rec.acked_txid == 17  # the next owner's floor
    assert released.token != created.token
    # Releasing twice does nothing: the record no longer names n1.
    assert isinstance(n1.release_owner(CELL, 1, 0), Rejected)
    # Anyone can acquire a released cell at the next epoch.
    _applied(OwnershipStore(bucket, "n2").cas_owner(CELL, Match(rec.token), 2))
    after = n1.read_owner(CELL)
    assert after is not None and (after.node, after.epoch) == ("n2", 2)


@pytest.mark.parametrize(
    ("releaser", "epoch"),
    [("n2", 3), ("n1", 2), ("n1", 4)],
    ids=["other-node", "older-epoch", "newer-epoch"],
)
def test_release_not_naming_this_node_at_epoch_writes_nothing(
    spy: Spy, releaser: str, epoch: int
) -> None:
    owner = OwnershipStore(spy.inner, "n1")
    token = _applied(owner.cas_owner(CELL, Absent(), 3)).token
    result = OwnershipStore(spy, releaser).release_owner(CELL, epoch, 0)
    assert isinstance(result, Rejected)
    assert spy.writes() == []
    rec = owner.read_owner(CELL)
    assert rec is not None and (rec.node, rec.epoch, rec.token) == ("n1", 3, token)


def test_release_of_absent_cell_creates_nothing(spy: Spy) -> None:
    assert isinstance(OwnershipStore(spy, "n1").release_owner(CELL, 1, 0), Rejected)
    assert spy.writes() == []
    assert spy.inner.get(keys.owner_key(CELL)) is None


def test_release_loses_to_a_concurrent_takeover(spy: Spy) -> None:
    n1 = OwnershipStore(spy, "n1")
    token = _applied(n1.cas_owner(CELL, Absent(), 1)).token

    def takeover(key: str) -> None:
        spy.before_cas = None
        _applied(OwnershipStore(spy.inner, "n2").cas_owner(CELL, Match(token), 2))

    spy.before_cas = takeover  # n2 moves between n1's read and n1's conditional write
    assert isinstance(n1.release_owner(CELL, 1, 0), Rejected)
    rec = n1.read_owner(CELL)
    assert rec is not None and (rec.node, rec.epoch) == ("n2", 2)


def test_invalid_cell_id_makes_no_request(spy: Spy) -> None:
    store = OwnershipStore(spy, "n1")
    for call in (
        lambda: store.read_owner("Counter:../../nodes/n1"),
        lambda: store.cas_owner("no-colon", Absent(), 1),
        lambda: store.release_owner("A:b\n", 1, 0),
    ):
        with pytest.raises(InvalidCellId):
            call()
    assert spy.calls == []


def test_corrupt_owner_record_is_an_error_not_absent(bucket: Bucket) -> None:
    bucket.put(keys.owner_key(CELL), b'{"node": "n1"}')
    with pytest.raises(BucketError):
        OwnershipStore(bucket, "n1").read_owner(CELL)


# --- node leases ----------------------------------------------------------------------


def _lease(node: str, *, ttl_ms: int = 10_000, **kw: object) -> NodeLease:
    fields: dict[str, object] = {
        "addr": f"127.0.0.1:{7000 + len(node)}",
        "expires_ms": now_ms() + ttl_ms,
        "generation": f"gen-{node}",
    }
    fields.update(kw)
    return NodeLease(node=node, **fields)  # type: ignore[arg-type]


def test_read_lease_roundtrip_and_renewal(bucket: Bucket) -> None:
    store = LeaseStore(bucket, "n1")
    assert store.read_lease("n1") is None
    lease = _lease("n1", load={"resident_cells": 4})
    created = _applied(store.cas_node_lease(Absent(), lease))
    snap = store.read_lease("n1")
    assert snap is not None and snap.token == created.token and snap.lease == lease

    # Identical content renewed: the nonce still changes the token (no ABA on S3 ETags).
    renewed = _applied(store.cas_node_lease(Match(created.token), lease))
    assert renewed.token != created.token
    assert isinstance(store.cas_node_lease(Match(created.token), lease), Rejected)
    assert isinstance(store.cas_node_lease(Absent(), lease), Rejected)
    snap = store.read_lease("n1")
    assert snap is not None and snap.token == renewed.token


def test_cannot_write_another_nodes_lease(spy: Spy) -> None:
    with pytest.raises(ValueError):
        LeaseStore(spy, "n1").cas_node_lease(Absent(), _lease("n2"))
    assert spy.calls == []


def _seed_fleet(bucket: Bucket) -> None:
    """Leases of every kind the peer listing must tell apart."""
    for node, lease in [
        ("n1", _lease("n1")),  # self
        ("n2", _lease("n2")),  # live peer
        ("n3", _lease("n3", ttl_ms=-5_000)),  # expired (beyond the Date header's second)
        ("n4", _lease("n4", peer_protocol=PEER_PROTOCOL + 1)),  # other protocol
        ("n5", _lease("n5", addr="")),  # unreachable
        ("n9", _lease("n9")),  # live, but its object will look stale
    ]:
        _applied(LeaseStore(bucket, node).cas_node_lease(Absent(), lease))
    bucket.put("nodes/n6.json", encode_lease(_lease("n7")))  # names another node
    bucket.put("nodes/sub/x.json", encode_lease(_lease("x")))  # not a lease key
    bucket.put("nodes/notes.txt", b"hello")
    bucket.put("nodes/n8.json", b"not json")  # corrupt


def test_capacity_peers_filter(spy: Spy) -> None:
    _seed_fleet(spy.inner)
    spy.aged_ms["nodes/n9.json"] = 61_000  # older than max(3 x 10 s, 60 s)
    peers = LeaseStore(spy, "n1", ttl_s=10.0).read_capacity_peers()
    assert [p.node for p in peers] == ["n2"]
    assert peers[0].addr and peers[0].generation == "gen-n2"
    reads = spy.ops("get")
    assert "nodes/n9.json" not in reads  # skipped from the listing, without a read
    assert "nodes/n1.json" not in reads  # self is not read either
    assert "nodes/notes.txt" not in reads
    assert spy.writes() == []


def test_capacity_peers_horizon_is_three_ttls_when_longer(spy: Spy) -> None:
    _seed_fleet(spy.inner)
    spy.aged_ms["nodes/n9.json"] = 70_000
    # TTL 10 s: horizon 60 s, the object is too old. TTL 30 s: horizon 90 s, it is not.
    assert [p.node for p in LeaseStore(spy, "n1", ttl_s=10.0).read_capacity_peers()] == ["n2"]
    assert [p.node for p in LeaseStore(spy, "n1", ttl_s=30.0).read_capacity_peers()] == [
        "n2",
        "n9",
    ]


def test_capacity_peers_by_reader_clock(bucket: Bucket) -> None:
    _seed_fleet(bucket)
    store = LeaseStore(bucket, "n2")
    assert [p.node for p in store.read_capacity_peers()] == ["n1", "n9"]
    # Once the reader's clock passes the leases' expiry nobody is live.
    assert store.read_capacity_peers(at_ms=now_ms() + 3_600_000) == []


def test_capacity_peers_empty_fleet(bucket: Bucket) -> None:
    assert LeaseStore(bucket, "n1").read_capacity_peers() == []


# --- peer key -------------------------------------------------------------------------


def test_ensure_peer_key_creates_once(spy: Spy) -> None:
    key = ensure_peer_key(spy)
    assert len(key) == 32
    stored = spy.inner.get(keys.PEER_AUTH_KEY)
    assert stored is not None
    assert json.loads(stored.body) == {"version": 1, "key": key.hex()}
    assert spy.ops("put_cas") == [keys.PEER_AUTH_KEY]
    assert ensure_peer_key(spy) == key
    assert spy.ops("put_cas") == [keys.PEER_AUTH_KEY]  # the second call only read


def _race_for_peer_key(spy: Spy) -> tuple[list[bytes], list[CasResult], list[BaseException]]:
    """Two nodes call ensure_peer_key at once on a fleet without a key."""
    spy.inner.delete(keys.PEER_AUTH_KEY)
    # Both threads must have read "absent" before either creates: a real race.
    barrier = threading.Barrier(2, timeout=30)
    outcomes: list[CasResult] = []
    results: list[bytes] = []
    errors: list[BaseException] = []

    def wait_for_both(key: str) -> None:
        barrier.wait()

    spy.before_cas = wait_for_both
    spy.after_cas = lambda key, result: outcomes.append(result)

    def node() -> None:
        try:
            results.append(ensure_peer_key(spy))
        except BaseException as err:  # surfaced by the caller's asserts
            errors.append(err)

    threads = [threading.Thread(target=node) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return results, outcomes, errors


def test_racing_nodes_end_with_the_same_key(spy: Spy) -> None:
    for _ in range(3):
        results, outcomes, errors = _race_for_peer_key(spy)
        assert errors == []
        assert len(results) == 2 and results[0] == results[1]
        assert sorted(type(o).__name__ for o in outcomes) == ["Applied", "Rejected"]
        stored = spy.inner.get(keys.PEER_AUTH_KEY)
        assert stored is not None and json.loads(stored.body)["key"] == results[0].hex()


def test_ambiguous_create_that_committed_is_read_back(spy: Spy) -> None:
    def ambiguous(key: str, result: CasResult) -> None:
        assert isinstance(result, Applied)
        raise AmbiguousWrite("timeout after commit")

    spy.after_cas = ambiguous
    key = ensure_peer_key(spy)
    stored = spy.inner.get(keys.PEER_AUTH_KEY)
    assert stored is not None and json.loads(stored.body)["key"] == key.hex()
    assert len(spy.ops("put_cas")) == 1


def test_ambiguous_create_that_did_not_commit_is_tried_again(spy: Spy) -> None:
    failures = [1]

    def lost(key: str) -> None:
        if failures:
            failures.pop()
            raise AmbiguousWrite("connection reset before the request left")

    spy.before_cas = lost
    key = ensure_peer_key(spy)
    stored = spy.inner.get(keys.PEER_AUTH_KEY)
    assert stored is not None and json.loads(stored.body)["key"] == key.hex()
    assert len(spy.ops("put_cas")) == 2


@pytest.mark.parametrize(
    "body",
    [
        b"garbage",
        b'{"version": 2, "key": "' + b"ab" * 32 + b'"}',
        b'{"version": 1, "key": "abcd"}',
        b'{"version": 1, "key": "' + b"zz" * 32 + b'"}',
    ],
)
def test_corrupt_peer_key_is_an_error(bucket: Bucket, body: bytes) -> None:
    bucket.put(keys.PEER_AUTH_KEY, body)
    with pytest.raises(BucketError):
        ensure_peer_key(bucket)
    stored = bucket.get(keys.PEER_AUTH_KEY)
    assert stored is not None and stored.body == body  # never silently replaced
