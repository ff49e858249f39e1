"""Table tests of :mod:`cellactors.core.feed_plan` and :mod:`cellactors.core.retention`: which
txids a feed returns from a listing and its seals, what a point-in-time restore reads, and
what a collection under retention deletes."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from cellactors.core import keys
from cellactors.core.feed_plan import Collected, FeedPlan, plan_feed, plan_point
from cellactors.core.restore_plan import (
    Hole,
    NeedSeal,
    Plan,
    PlanResult,
    SnapshotRef,
    parse_listing,
)
from cellactors.core.retention import covered_by, retention_base

CELL = "Counter:a"
ROOT = keys.cell_root(CELL)


def b(epoch: int, first: int, last: int) -> str:
    return keys.batch_key(CELL, epoch, first, last)


def seal(epoch: int) -> str:
    return keys.seal_key(CELL, epoch)


def snap(txid: int, epoch: int) -> str:
    return keys.snapshot_key(CELL, txid, epoch)


def feed(
    objects: list[str],
    owner: int | None,
    seals: dict[int, int],
    after: int = 0,
    unusable: frozenset[str] = frozenset(),
) -> object:
    """Plan, reading every seal the plan asks for from ``seals`` (as the executor does)."""
    listing = parse_listing(ROOT, objects)
    read: dict[int, int] = {}
    while True:
        result = plan_feed(listing, owner, read, after, unusable)
        if isinstance(result, NeedSeal):
            assert result.epoch in seals, f"asked for the seal of epoch {result.epoch}"
            read[result.epoch] = seals[result.epoch]
            continue
        return result


def txids(result: object) -> list[tuple[int, int]]:
    """(epoch, txid) of every transaction the plan returns."""
    assert isinstance(result, FeedPlan), result
    return [(s.epoch, t) for s in result.steps for t in range(s.after + 1, s.upto + 1)]


@dataclass
class Case:
    name: str
    objects: list[str]
    owner: int | None
    seals: dict[int, int]
    after: int
    expect: list[tuple[int, int]] = field(default_factory=list)
    waiting: int | None = None


CASES = [
    Case("no cell", [], None, {}, 0),
    Case(
        "one epoch, its owner's chain", [b(1, 1, 2), b(1, 3, 3)], 1, {}, 0, [(1, 1), (1, 2), (1, 3)]
    ),
    Case("after a txid", [b(1, 1, 2), b(1, 3, 3)], 1, {}, 2, [(1, 3)]),
    Case("caught up", [b(1, 1, 2)], 1, {}, 2),
    Case(
        "overlapping retry",
        [b(1, 1, 2), b(1, 1, 3), b(1, 4, 4)],
        1,
        {},
        0,
        [(1, 1), (1, 2), (1, 3), (1, 4)],
    ),
    Case(
        "takeover: sealed epoch read up to its seal, never the late batch above it",
        [b(1, 1, 2), b(1, 3, 3), seal(1), b(1, 4, 4), b(2, 4, 5)],
        2,
        {1: 3},
        0,
        [(1, 1), (1, 2), (1, 3), (2, 4), (2, 5)],
    ),
    Case(
        "late batch overlapping the seal: only up to the seal",
        [b(1, 1, 2), b(1, 3, 5), seal(1)],
        2,
        {1: 4},
        0,
        [(1, 1), (1, 2), (1, 3), (1, 4)],
    ),
    Case("new owner acquired but not sealed yet: wait for the seal", [b(1, 1, 2)], 2, {}, 0, [], 1),
    Case(
        "waits after what is sealed",
        [b(1, 1, 2), seal(1), b(2, 3, 4)],
        3,
        {1: 2},
        0,
        [(1, 1), (1, 2)],
        2,
    ),
    Case(
        "empty sealed epoch between",
        [b(1, 1, 2), seal(1), seal(2), b(3, 3, 3)],
        3,
        {1: 2, 2: 2},
        0,
        [(1, 1), (1, 2), (3, 3)],
    ),
    Case(
        "unacknowledged tail sealed in whole by the next owner",
        [b(1, 1, 2), b(1, 3, 3), seal(1)],
        2,
        {1: 3},
        1,
        [(1, 2), (1, 3)],
    ),
    Case(
        "tail dropped by the next owner's seal (torn upload)",
        [b(1, 1, 2), b(1, 3, 3), seal(1), b(2, 3, 3)],
        2,
        {1: 2},
        0,
        [(1, 1), (1, 2), (2, 3)],
    ),
    Case(
        "retained epochs after a collection, reading inside them",
        [b(3, 10, 12), seal(3), b(4, 13, 14), snap(9, 3), snap(12, 4)],
        4,
        {3: 12},
        11,
        [(3, 12), (4, 13), (4, 14)],
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_plan_feed(case: Case) -> None:
    result = feed(case.objects, case.owner, case.seals, case.after)
    assert txids(result) == case.expect
    assert isinstance(result, FeedPlan)
    assert result.waiting_for == case.waiting
    assert result.last_txid == (case.expect[-1][1] if case.expect else case.after)


def test_feed_never_reads_a_fenced_owners_late_batches_of_a_sealed_epoch() -> None:
    late = b(1, 4, 6)
    result = feed([b(1, 1, 3), seal(1), late, b(2, 4, 4)], 2, {1: 3})
    assert isinstance(result, FeedPlan)
    assert late not in [r.key for r in result.reads]
    assert txids(result)[-1] == (2, 4)


def test_feed_gap_below_every_batch_is_collected_and_names_the_snapshot() -> None:
    objects = [b(3, 10, 12), seal(3), b(4, 13, 14), snap(9, 3), snap(12, 4)]
    result = feed(objects, 4, {3: 12}, after=2)
    assert result == Collected(2, 10, SnapshotRef(9, 3, snap(9, 3)))


def test_feed_collected_without_snapshot_at_or_after_the_oldest_batch() -> None:
    result = feed([b(2, 10, 12)], 2, {}, after=0)
    assert result == Collected(0, 10, None)


def test_feed_skips_a_fenced_owners_late_snapshot_as_the_place_to_start() -> None:
    # Snapshot at txid 13 of epoch 3 lies beyond epoch 3's seal (12): never a start.
    objects = [b(3, 10, 12), seal(3), b(4, 13, 14), snap(13, 3), snap(14, 4)]
    result = feed(objects, 4, {3: 12}, after=0)
    assert result == Collected(0, 10, SnapshotRef(14, 4, snap(14, 4)))


@pytest.mark.parametrize(
    ("objects", "owner", "seals", "after"),
    [
        ([b(1, 1, 2), b(1, 4, 4)], 1, {}, 0),  # a batch missing in the middle
        ([b(1, 1, 2), seal(1), b(2, 5, 5)], 2, {1: 2}, 0),  # next epoch starts late
        ([b(1, 1, 2), seal(1), b(2, 4, 4)], 2, {1: 3}, 0),  # sealed epoch stops short
        ([b(1, 1, 2), seal(2), b(3, 3, 3)], 3, {2: 2}, 0),  # epoch 1's seal missing
        ([b(1, 1, 2), snap(5, 1)], 1, {}, 0),  # a snapshot proves more than the batches
    ],
)
def test_feed_holes(objects: list[str], owner: int, seals: dict[int, int], after: int) -> None:
    assert isinstance(feed(objects, owner, seals, after), Hole)


def test_feed_plans_without_a_torn_batch_at_the_end() -> None:
    torn = b(1, 3, 3)
    result = feed([b(1, 1, 2), torn], 1, {}, 0, frozenset({torn}))
    assert txids(result) == [(1, 1), (1, 2)]


def test_feed_reads_the_newest_seal_even_without_batches_beyond() -> None:
    listing = parse_listing(ROOT, [b(1, 1, 2), seal(1)])
    assert plan_feed(listing, 2, {}, 2) == NeedSeal(1)


# --- plan_point ------------------------------------------------------------------------------


def point(
    objects: list[str], current: int, seals: dict[int, int], target: int, **kw: object
) -> PlanResult | Collected:
    listing = parse_listing(ROOT, objects)
    read: dict[int, int] = {}
    while True:
        result = plan_point(listing, current, read, target, **kw)  # type: ignore[arg-type]
        if isinstance(result, NeedSeal):
            read[result.epoch] = seals[result.epoch]
            continue
        return result


def test_point_uses_the_newest_snapshot_at_or_below_and_caps_at_the_target() -> None:
    objects = [b(1, 1, 4), b(1, 5, 8), seal(1), snap(4, 1), b(2, 9, 12), snap(10, 2)]
    result = point(objects, 3, {1: 8}, 6)
    assert isinstance(result, Plan)
    assert result.snapshot == SnapshotRef(4, 1, snap(4, 1))
    assert result.last_txid == 6
    assert [r.key for r in result.reads] == [b(1, 5, 8)]
    assert not result.seals  # read-only


def test_point_from_empty_when_no_snapshot_is_low_enough() -> None:
    result = point([b(1, 1, 4), snap(4, 1)], 2, {}, 2)
    assert isinstance(result, Plan)
    assert result.snapshot is None
    assert result.last_txid == 2


def test_point_older_than_what_was_kept_is_collected() -> None:
    objects = [seal(2), b(2, 9, 12), snap(10, 2), snap(12, 2)]
    result = point(objects, 3, {2: 12}, 5)
    assert result == Collected(5, 10, SnapshotRef(10, 2, snap(10, 2)))


def test_point_excluded_snapshots_are_not_used() -> None:
    # A restore as of a time skips snapshots uploaded after it.
    result = point([b(1, 1, 4), snap(4, 1)], 2, {}, 2**63, excluded=frozenset({snap(4, 1)}))
    assert isinstance(result, Plan)
    assert result.snapshot is None


def test_point_is_not_stopped_by_a_hole_above_it() -> None:
    # Epoch 1 is sealed at 8 but its batch 5..8 is gone: a restore to now fails, a restore
    # to txid 3 neither reads nor checks anything above 3.
    objects = [b(1, 1, 4), seal(1), b(2, 9, 9)]
    assert isinstance(point(objects, 3, {1: 8}, 2**63), Hole)
    result = point(objects, 3, {1: 8}, 3)
    assert isinstance(result, Plan)
    assert [r.key for r in result.reads] == [b(1, 1, 4)]
    assert result.last_txid == 3


def test_point_below_every_snapshot_with_its_batches_kept_is_not_collected() -> None:
    # Every snapshot lies above the target, but the batches up to it are all there (a missing
    # batch above it made the whole plan a hole, reported as collected).
    objects = [b(1, 1, 4), seal(1), snap(8, 1), b(2, 9, 12)]
    result = point(objects, 3, {1: 8}, 2)
    assert isinstance(result, Plan)
    assert result.snapshot is None
    assert [r.key for r in result.reads] == [b(1, 1, 4)]
    assert result.last_txid == 2


def test_point_in_an_unsealed_owner_epoch_ignores_a_gap_above_it() -> None:
    objects = [b(1, 1, 2), b(1, 3, 4), b(1, 7, 8)]  # 5..6 missing, above the target
    result = point(objects, 2, {}, 4)
    assert isinstance(result, Plan) and result.last_txid == 4
    assert isinstance(point(objects, 2, {}, 6), Hole)


# --- retention -------------------------------------------------------------------------------


def test_retention_base_is_the_newest_snapshot_old_enough() -> None:
    objects = [b(1, 1, 4), seal(1), snap(4, 1), b(2, 5, 9), snap(8, 2), snap(9, 2)]
    listing = parse_listing(ROOT, objects)
    uploaded = {snap(4, 1): 100, snap(8, 2): 200, snap(9, 2): 300}
    newest = SnapshotRef(9, 2, snap(9, 2))
    assert retention_base(listing, uploaded, 2, newest, {}, 50) is None  # none aged yet
    assert retention_base(listing, uploaded, 2, newest, {}, 150) == NeedSeal(1)
    assert retention_base(listing, uploaded, 2, newest, {1: 4}, 150) == SnapshotRef(
        4, 1, snap(4, 1)
    )
    assert retention_base(listing, uploaded, 2, newest, {1: 4}, 250) == SnapshotRef(
        8, 2, snap(8, 2)
    )
    assert retention_base(listing, uploaded, 2, newest, {1: 4}, 10**9) == newest


def test_retention_never_bases_on_a_late_or_unvouched_snapshot() -> None:
    # Epoch 1 sealed at 4: its snapshot at 6 is a fenced owner's late one. Epoch 2 is
    # unsealed below the owner's epoch 3: nothing vouches for its snapshot.
    objects = [b(1, 1, 4), seal(1), snap(6, 1), b(2, 5, 5), snap(5, 2), b(3, 6, 9)]
    listing = parse_listing(ROOT, objects)
    uploaded = {snap(6, 1): 1, snap(5, 2): 1}
    newest = SnapshotRef(9, 3, snap(9, 3))
    assert retention_base(listing, uploaded, 3, newest, {1: 4}, 10) is None


def test_covered_by_deletes_below_the_base_only() -> None:
    objects = [b(1, 1, 4), seal(1), snap(4, 1), b(2, 5, 9), seal(2), snap(8, 2), b(3, 10, 10)]
    plan = covered_by(parse_listing(ROOT, objects), SnapshotRef(8, 2, snap(8, 2)))
    assert plan.batch_keys == (b(1, 1, 4),)
    assert plan.seal_epochs == (1,)
    assert plan.snapshot_keys == (snap(4, 1),)


def test_feed_ignores_a_seal_re_created_below_a_snapshot_it_has_passed() -> None:
    # Epoch 4's snapshot at txid 1 stands for everything before it; the seals of epochs 1
    # and 2 were re-created by deposed restorers after a collection (docs/protocol.md).
    objects = [seal(1), seal(2), snap(1, 4), b(4, 2, 2)]
    for after in (1, 2):
        assert txids(feed(objects, 4, {1: 3, 2: 3, 4: 9}, after)) == [(4, 2)][after - 1 :]


def test_feed_reports_a_missing_seal_below_a_written_epoch_instead_of_waiting() -> None:
    # The owner of epoch 2 wrote a batch: it sealed epoch 1 first, so that seal is missing.
    result = feed([b(1, 1, 2), b(2, 3, 3)], 2, {}, 0)
    assert isinstance(result, Hole) and "seal is missing" in result.reason
    # Epoch 2 claimed but not written yet: its owner may still be sealing epoch 1.
    waiting = feed([b(1, 1, 2)], 2, {}, 0)
    assert isinstance(waiting, FeedPlan) and waiting.waiting_for == 1
