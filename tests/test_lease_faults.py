"""Lease faults on the real store, in process: transient errors never fence a healthy node,
a 412 is reconciled by reading the record, only another process generation fences early,
taking the lease backs off while the store fails, a clock off the store's is refused at
start, and a store clock that jumps forward fences.

Each fault is injected by a wrapper on the lease key only; TTLs are ones a loaded machine
can renew (2 s)."""

from __future__ import annotations

import re
import threading
import time

import pytest

from cellactors import Node, NodeSettings
from cellactors.clock import StoreClock, mono, wall_ms
from cellactors.core import keys
from cellactors.errors import AmbiguousWrite, BucketError, ClockSkew
from cellactors.persistence.control.leases import LeaseStore, NodeLease
from cellactors.persistence.store.bucket import Applied, Bucket, CasResult, Guard, Match
from cellactors.persistence.store.s3 import S3Bucket
from tests.helpers.buckets import CuttableBucket
from tests.helpers.cells import Counter
from tests.helpers.runtime import eventually

LEASE = keys.lease_key("n1")
TTL = 2.0


class LeaseFaults(CuttableBucket):
    """Injects one fault at a time into requests on the lease key of ``n1``."""

    def __init__(self, inner: Bucket) -> None:
        super().__init__(inner)
        self.lock = threading.Lock()
        self.cas_faults: list[str] = []  # "503" (not applied) or "lost" (applied, answer lost)
        self.get_faults = 0  # lease GETs that fail
        self.fail_all_until = 0.0  # monotonic: every lease request fails with a 503 until then
        self.requests: list[float] = []  # monotonic times of lease requests
        self.clock_offset_ms = 0  # this machine's clock minus the store's, as answers show
        self.store_clock = StoreClock("lease faults")

    @property
    def clock(self) -> StoreClock:
        return self.store_clock

    def _answered(self, sent: float) -> None:
        """Every answer shows the store's time: this machine's, shifted by the offset."""
        self.store_clock.observe_ms(sent, mono(), wall_ms() - self.clock_offset_ms, 1)

    def _lease_request(self, key: str) -> bool:
        if key != LEASE:
            return False
        with self.lock:
            self.requests.append(time.monotonic())
        if time.monotonic() < self.fail_all_until:
            raise AmbiguousWrite("HTTP 503 SlowDown (test)")
        return True

    def get(self, key):  # type: ignore[no-untyped-def]
        sent = mono()
        if self._lease_request(key):
            with self.lock:
                fail = self.get_faults > 0
                self.get_faults -= fail
            if fail:
                raise BucketError("GET failed: HTTP 503 (test)")
        found = self.inner.get(key)
        self._answered(sent)
        return found

    def put_cas(self, key: str, body: bytes, guard: Guard) -> CasResult:
        sent = mono()
        if not self._lease_request(key):
            return self.inner.put_cas(key, body, guard)
        with self.lock:
            fault = self.cas_faults.pop(0) if self.cas_faults else ""
        if fault == "503":
            raise AmbiguousWrite("HTTP 503 (test): not applied")
        result = self.inner.put_cas(key, body, guard)
        if fault == "lost":
            raise AmbiguousWrite("connection reset after the write applied (test)")
        self._answered(sent)
        return result


def start_node(bucket: Bucket, fenced: list[str], **settings: object) -> Node:
    node = Node(
        bucket,
        "n1",
        [Counter],
        NodeSettings(lease_ttl=TTL, advertise="127.0.0.1:19", **settings),  # type: ignore[arg-type]
        on_fence=fenced.append,
    )
    return node.start(give_up_after=30)


def renewals(node: Node) -> int:
    return int(node.lease.proxy().renewals.get())


def survives(node: Node, fenced: list[str], renewals_more: int) -> None:
    """The node keeps renewing (``renewals_more`` more successful renewals) unfenced."""
    start = renewals(node)
    eventually(lambda: renewals(node) >= start + renewals_more, timeout=renewals_more * TTL + 10)
    assert fenced == [] and node.status == "serving"


@pytest.fixture
def faults(sw_bucket: S3Bucket) -> LeaseFaults:
    return LeaseFaults(sw_bucket)


def test_one_503_on_a_renewal_does_not_fence(faults: LeaseFaults) -> None:
    fenced: list[str] = []
    node = start_node(faults, fenced)
    try:
        faults.cas_faults = ["503"]
        eventually(lambda: not faults.cas_faults, timeout=10)
        survives(node, fenced, 3)
        assert node.cell(Counter, "a").increment("x") == 1
    finally:
        node.stop()


def test_applied_renewal_with_lost_answer_and_failed_read_back_does_not_fence(
    faults: LeaseFaults,
) -> None:
    """The write applied but neither its answer nor the read-back arrived: the token held is
    stale, so the next renewal gets a 412, which reading the record shows is our own."""
    fenced: list[str] = []
    node = start_node(faults, fenced)
    try:
        faults.get_faults = 1
        faults.cas_faults = ["lost"]
        eventually(lambda: not faults.cas_faults and faults.get_faults == 0, timeout=10)
        survives(node, fenced, 3)
    finally:
        node.stop()


def test_a_storm_of_503s_on_lease_requests_does_not_fence(faults: LeaseFaults) -> None:
    fenced: list[str] = []
    node = start_node(faults, fenced)
    try:
        faults.cas_faults = ["503", "", "503", "503", "", "lost", "503", "", "503"]
        eventually(lambda: not faults.cas_faults, timeout=30)
        survives(node, fenced, 2)
    finally:
        node.stop()


def test_another_generation_taking_the_identity_fences(faults: LeaseFaults) -> None:
    fenced: list[str] = []
    node = start_node(faults, fenced)
    try:
        thief = LeaseStore(faults.inner, "n1", TTL)
        current = thief.read_lease("n1")
        assert current is not None
        stolen = NodeLease("n1", "127.0.0.1:20", current.lease.expires_ms + 60_000, "thief")

        assert isinstance(thief.cas_node_lease(Match(current.token), stolen), Applied)
        eventually(lambda: bool(fenced), timeout=2 * TTL + 5)
        assert "generation thief" in fenced[0]
        assert node.status == "fenced"
    finally:
        node.stop()


def test_taking_the_lease_backs_off_while_the_store_fails(faults: LeaseFaults) -> None:
    fenced: list[str] = []
    faults.fail_all_until = time.monotonic() + 3.0
    node = start_node(faults, fenced)
    try:
        early = [t for t in faults.requests if t < faults.fail_all_until]
        # Capped exponential backoff: a handful of tries in 3 s, not hundreds.
        assert 3 <= len(early) <= 30, len(early)
        assert node.status == "serving"
    finally:
        node.stop()


def test_a_clock_off_the_store_refuses_to_start(faults: LeaseFaults) -> None:
    faults.clock_offset_ms = 5_000  # the store is 5 s behind this machine
    node = Node(faults, "n1", [Counter], NodeSettings(lease_ttl=TTL, advertise="127.0.0.1:19"))
    with pytest.raises(ClockSkew, match=r"at least [345]\.\ds ahead of the store's"):
        node.start(give_up_after=10)
    node.stop()


def test_a_clock_within_the_bound_starts(faults: LeaseFaults) -> None:
    faults.clock_offset_ms = 200
    fenced: list[str] = []
    node = start_node(faults, fenced)
    node.stop()
    assert fenced == []


def test_a_store_clock_that_jumps_ahead_after_start_fences(faults: LeaseFaults) -> None:
    """Peers judge leases on the store's clock: one that jumps 5 s ahead may make them see
    this node's lease as expired early, so the node fences at its next answer."""
    fenced: list[str] = []
    node = start_node(faults, fenced, max_clock_skew=1.0)
    try:
        faults.clock_offset_ms = -5_000  # the store now reads 5 s ahead of this machine
        eventually(lambda: bool(fenced), timeout=2 * TTL + 5)
        assert re.search(r"the store's clock jumped \+[45]\.\d+s", fenced[0]), fenced
        assert node.metrics_text().count('cellactors_clock_jumps_total{clock="store"} 1.0') == 1
    finally:
        node.stop()


def test_a_store_clock_that_jumps_back_does_not_fence(faults: LeaseFaults) -> None:
    """A store clock that moves back only makes leases look live longer: nothing to fence
    for (the node logs it and counts it)."""
    fenced: list[str] = []
    node = start_node(faults, fenced, max_clock_skew=10.0)
    try:
        faults.clock_offset_ms = 5_000
        survives(node, fenced, 3)
        assert 'cellactors_clock_jumps_total{clock="store"} 1.0' in node.metrics_text()
    finally:
        node.stop()
