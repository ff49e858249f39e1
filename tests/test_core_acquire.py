"""Table-driven tests of :mod:`cellactors.core.acquire` (docs/protocol.md, "Ownership")."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from cellactors.core import acquire
from cellactors.core.acquire import Claim, ReadLease, Remote, confirmed, decide
from cellactors.errors import CellPurging
from cellactors.persistence.control.leases import NodeLease
from cellactors.persistence.control.ownership import OwnerRecord
from cellactors.persistence.store.bucket import Absent, Match

ME = "n1"
NOW = 1_000_000


def lease(node: str = "n2", expires_ms: int = NOW + 5_000, addr: str = "http://n2") -> NodeLease:
    return NodeLease(node=node, addr=addr, expires_ms=expires_ms, generation="g")


@dataclass(frozen=True)
class Case:
    name: str
    record: OwnerRecord | None
    lease: object  # NodeLease | None | acquire._UNREAD
    expected: acquire.Decision


OTHER = OwnerRecord(node="n2", epoch=7, token="t7")
TAKEOVER = Claim(epoch=8, guard=Match("t7"), takeover=True, previous_owner="n2")

CASES = [
    Case("absent", None, acquire._UNREAD, Claim(epoch=1, guard=Absent())),
    Case("own", OwnerRecord(ME, 3, "t3"), acquire._UNREAD, Claim(epoch=4, guard=Match("t3"))),
    Case("released", OwnerRecord("", 5, "t5"), acquire._UNREAD, Claim(6, Match("t5"))),
    Case("other, lease not read yet", OTHER, acquire._UNREAD, ReadLease("n2")),
    Case("other, live lease", OTHER, lease(), Remote("n2", "http://n2", "g")),
    Case("other, lease expired", OTHER, lease(expires_ms=NOW - 1), TAKEOVER),
    Case("other, lease expires exactly now", OTHER, lease(expires_ms=NOW), TAKEOVER),
    Case(
        "other, lease expires next ms",
        OTHER,
        lease(expires_ms=NOW + 1),
        Remote("n2", "http://n2", "g"),
    ),
    Case("other, lease missing", OTHER, None, TAKEOVER),
    Case("other, lease of a different node", OTHER, lease(node="n3"), TAKEOVER),
    Case("other, live lease without addr", OTHER, lease(addr=""), TAKEOVER),
    Case("other, graceful-stop lease (expires 0)", OTHER, lease(expires_ms=0), TAKEOVER),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_decide(case: Case) -> None:
    assert decide(ME, case.record, NOW, case.lease) == case.expected


@pytest.mark.parametrize(
    "record",
    [None, OwnerRecord(ME, 3, "t3"), OwnerRecord("", 5, "t5")],
    ids=["absent", "own", "released"],
)
def test_decide_ignores_a_lease_when_no_other_owner(record: OwnerRecord | None) -> None:
    """Absent, own and released records never depend on a lease, even a live one."""
    without = decide(ME, record, NOW)
    assert decide(ME, record, NOW, lease()) == without
    assert decide(ME, record, NOW, None) == without
    assert isinstance(without, Claim) and not without.takeover


@pytest.mark.parametrize("epoch", [1, 2, 41, 2**40])
def test_every_claim_moves_the_epoch_forward(epoch: int) -> None:
    for record, lse in [
        (OwnerRecord(ME, epoch, "t"), acquire._UNREAD),
        (OwnerRecord("", epoch, "t"), acquire._UNREAD),
        (OwnerRecord("n2", epoch, "t"), None),
    ]:
        decision = decide(ME, record, NOW, lse)
        assert isinstance(decision, Claim)
        assert decision.epoch == epoch + 1
        assert decision.guard == Match("t")


def test_never_steals_from_a_live_owner_at_any_time_before_expiry() -> None:
    for now in range(NOW - 3, NOW + 5_000):
        assert isinstance(decide(ME, OTHER, now, lease(expires_ms=NOW + 5_000)), Remote)


CLAIM = Claim(epoch=4, guard=Match("t3"))


@pytest.mark.parametrize(
    ("read_back", "expected"),
    [
        (None, False),
        (OwnerRecord(ME, 4, "x"), True),
        (OwnerRecord(ME, 3, "t3"), False),
        (OwnerRecord(ME, 5, "y"), False),
        (OwnerRecord("n2", 4, "x"), False),
        (OwnerRecord("", 4, "x"), False),
    ],
    ids=["absent", "me at new epoch", "me at old epoch", "me later", "other", "released"],
)
def test_confirmed(read_back: OwnerRecord | None, expected: bool) -> None:
    assert confirmed(ME, CLAIM, read_back) is expected


def test_bounds() -> None:
    assert acquire.MAX_ATTEMPTS >= 1
    assert acquire.MAX_AMBIGUOUS == 3


def test_names_is_the_one_ownership_test() -> None:
    record = OwnerRecord(node="n1", epoch=3, token="t")
    assert acquire.names(record, "n1", 3)
    assert not acquire.names(record, "n1", 2)  # an older activation of the same node
    assert not acquire.names(record, "n2", 3)
    assert not acquire.names(None, "n1", 3)
    assert not acquire.names(OwnerRecord(node="", epoch=3, token="t"), "n1", 3)  # released


def test_a_record_marked_purging_is_never_claimed() -> None:
    record = OwnerRecord("", 4, "t", acked_txid=9, purging=True)
    with pytest.raises(CellPurging, match="purged"):
        decide("n1", record, 0)
    assert not OwnerRecord("", 4, "t").purging
