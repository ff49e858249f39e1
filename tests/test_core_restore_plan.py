"""Table-driven tests of :mod:`cellactors.core.restore_plan` (docs/protocol.md, "Restore and
the epoch seal")."""

from __future__ import annotations

import itertools
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from cellactors.core import keys
from cellactors.core.restore_plan import (
    BatchRef,
    EpochStep,
    Hole,
    Lagging,
    Listing,
    NeedSeal,
    Plan,
    PlanResult,
    SnapshotRef,
    chain,
    choose_snapshot,
    epochs_to_restore,
    needs_seal_read,
    parse_listing,
    plan_epoch,
    plan_restore,
    proven_txid,
)
from cellactors.persistence.history.snapshots import collect_garbage
from cellactors.persistence.store.memory import MemoryBucket

CELL = "Counter:a"
ROOT = keys.cell_root(CELL)


def ref(first: int, last: int, epoch: int = 1) -> BatchRef:
    return BatchRef(keys.batch_key(CELL, epoch, first, last), first, last)


def spans(refs: list[BatchRef] | tuple[BatchRef, ...]) -> list[tuple[int, int]]:
    return [(r.first, r.last) for r in refs]


# --- parse_listing -------------------------------------------------------------------------


def test_parse_listing_classifies_keys() -> None:
    listed = [
        keys.owner_key(CELL),
        keys.batch_key(CELL, 1, 1, 3),
        keys.batch_key(CELL, 1, 4, 4),
        keys.batch_key(CELL, 1, 1, 5),  # an overlapping retry
        keys.batch_key(CELL, 12, 6, 9),
        keys.seal_key(CELL, 1),
        keys.seal_key(CELL, 10),
        keys.snapshot_key(CELL, 4, 2),
        keys.snapshot_key(CELL, 17, 3),
        ROOT + "e2/not-a-batch.txt",
        ROOT + "e2/0000000000000005-0000000000000004.batch",  # first > last
        ROOT + "eX/0000000000000001-0000000000000001.batch",
        ROOT + "e3/sub/0000000000000001-0000000000000001.batch",
        ROOT + "snap/xyz.snap",
        ROOT + "stray.json",
        "cells/Counter:ab/e1/0000000000000001-0000000000000001.batch",  # another cell
        keys.batch_key("Counter:b", 1, 1, 1),
    ]
    listing = parse_listing(ROOT, listed)
    assert set(listing.batches) == {1, 12}
    # Sorted by first txid, longer span first.
    assert spans(listing.batches[1]) == [(1, 5), (1, 3), (4, 4)]
    assert spans(listing.batches[12]) == [(6, 9)]
    assert listing.seals == {1, 10}
    assert listing.snapshots == [
        (17, 3, keys.snapshot_key(CELL, 17, 3)),
        (4, 2, keys.snapshot_key(CELL, 4, 2)),
    ]


def test_parse_listing_of_nothing() -> None:
    listing = parse_listing(ROOT, [])
    assert listing.batches == {} and listing.seals == set() and listing.snapshots == []


# --- chain ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("batches", "after", "limit", "reads", "reached"),
    [
        pytest.param([], 0, None, [], 0, id="empty"),
        pytest.param([], 7, None, [], 7, id="empty keeps after"),
        pytest.param([(1, 3), (4, 6)], 0, None, [(1, 3), (4, 6)], 6, id="contiguous"),
        pytest.param([(4, 6), (1, 3)], 0, None, [(1, 3), (4, 6)], 6, id="unsorted input"),
        pytest.param([(1, 3), (5, 6)], 0, None, [(1, 3)], 3, id="gap stops"),
        pytest.param([(2, 3)], 0, None, [], 0, id="gap at the start"),
        pytest.param([(1, 3), (1, 5), (4, 6)], 0, None, [(1, 5), (4, 6)], 6, id="overlaps"),
        pytest.param([(1, 3), (2, 3), (3, 3)], 0, None, [(1, 3)], 3, id="covered skipped"),
        pytest.param([(1, 3), (4, 6)], 3, None, [(4, 6)], 6, id="resume after"),
        pytest.param([(1, 5)], 3, None, [(1, 5)], 5, id="batch straddles after"),
        pytest.param([(1, 3)], 5, None, [], 5, id="all below after"),
        pytest.param([(6, 8)], 5, None, [(6, 8)], 8, id="continues from after"),
        pytest.param([(1, 3), (4, 6)], 0, 4, [(1, 3), (4, 6)], 4, id="seal cuts a batch"),
        pytest.param([(1, 3), (4, 6)], 0, 3, [(1, 3)], 3, id="seal at a batch boundary"),
        pytest.param([(1, 3), (4, 6)], 0, 0, [], 0, id="seal at zero"),
        pytest.param([(1, 3), (4, 6)], 5, 3, [], 5, id="seal below after"),
        pytest.param([(1, 3)], 0, 9, [(1, 3)], 3, id="seal beyond the chain"),
        pytest.param([(1, 2), (4, 6)], 0, 5, [(1, 2)], 2, id="gap before the seal"),
    ],
)
def test_chain(
    batches: list[tuple[int, int]],
    after: int,
    limit: int | None,
    reads: list[tuple[int, int]],
    reached: int,
) -> None:
    got, cur = chain([ref(a, b) for a, b in batches], after, limit)
    assert spans(got) == reads
    assert cur == reached


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 20), st.integers(0, 5)), max_size=8),
    st.integers(0, 12),
    st.one_of(st.none(), st.integers(0, 25)),
)
def test_chain_properties(raw: list[tuple[int, int]], after: int, limit: int | None) -> None:
    refs = [ref(first, first + n) for first, n in raw]
    reads, cur = chain(refs, after, limit)
    covered: set[int] = set()
    for r in refs:
        covered.update(range(r.first, r.last + 1))
    # Reached exactly the end of the contiguous run after ``after`` (clamped to the limit).
    expected = after
    while expected + 1 in covered and (limit is None or expected < limit):
        expected += 1
    assert cur == expected
    # The reads cover after+1..cur contiguously, each read adds something new.
    got: set[int] = set()
    prev = after
    for r in reads:
        assert r.first <= prev + 1 < r.last + 1
        got.update(range(r.first, r.last + 1))
        prev = r.last
    assert set(range(after + 1, cur + 1)) <= got


# --- plan_epoch ----------------------------------------------------------------------------


def listing_of(epoch_batches: dict[int, list[tuple[int, int]]], seals: set[int]) -> Listing:
    listed = [keys.seal_key(CELL, e) for e in seals]
    for e, spans_ in epoch_batches.items():
        listed += [keys.batch_key(CELL, e, a, b) for a, b in spans_]
    return parse_listing(ROOT, listed)


def test_plan_unsealed_epoch_follows_the_chain_and_seals() -> None:
    listing = listing_of({1: [(1, 3), (4, 5), (7, 7)]}, set())
    step = plan_epoch(listing, 1, 0, None)
    assert step == EpochStep(1, 0, 5, tuple(listing.batches[1][:2]), seal=True)


def test_plan_unsealed_empty_epoch_is_sealed_at_after() -> None:
    step = plan_epoch(listing_of({}, set()), 3, 9, None)
    assert step == EpochStep(3, 9, 9, (), seal=True)


def test_a_plan_capped_at_a_point_seals_nothing() -> None:
    # A restore to a txid reads an unsealed chain only up to it: it has not seen where the
    # chain ends, so it must never seal (it is read-only anyway).
    listing = listing_of({1: [(1, 3), (4, 5)]}, set())
    assert plan_epoch(listing, 1, 0, None, cap=4) == EpochStep(
        1, 0, 4, tuple(listing.batches[1]), seal=False
    )
    assert plan_epoch(listing, 1, 0, None, cap=9).seal is False  # capped above its end
    planned = plan_restore(listing, 2, {}, target=4)
    assert isinstance(planned, Plan) and planned.last_txid == 4
    assert planned.seals == ()
    uncapped = plan_restore(listing, 2, {})
    assert isinstance(uncapped, Plan) and [s.epoch for s in uncapped.seals] == [1]


def test_plan_sealed_epoch_stops_at_the_seal() -> None:
    listing = listing_of({1: [(1, 3), (4, 6)]}, {1})
    step = plan_epoch(listing, 1, 0, 4)
    assert step.seal is False
    assert step.upto == 4
    assert spans(step.reads) == [(1, 3), (4, 6)]


def test_plan_sealed_epoch_ignores_late_appends() -> None:
    """A fenced owner's batches beyond the seal are never read."""
    listing = listing_of({1: [(1, 3), (4, 4)]}, {1})
    step = plan_epoch(listing, 1, 0, 3)
    assert step == EpochStep(1, 0, 3, (listing.batches[1][0],), seal=False)


def test_plan_sealed_epoch_below_after() -> None:
    listing = listing_of({1: [(1, 3)]}, {1})
    step = plan_epoch(listing, 1, 5, 3)
    assert step == EpochStep(1, 5, 5, (), seal=False)


# --- epochs_to_restore / needs_seal_read ---------------------------------------------------


@pytest.mark.parametrize(
    ("from_epoch", "current", "expected"),
    [
        (1, 1, []),
        (1, 2, [1]),
        (1, 5, [1, 2, 3, 4]),
        (0, 3, [1, 2]),
        (3, 6, [3, 4, 5]),
        (6, 6, []),
    ],
)
def test_epochs_to_restore_includes_empty_epochs(
    from_epoch: int, current: int, expected: list[int]
) -> None:
    # The listing does not matter: empty epochs must be sealed too.
    for listing in (Listing(), listing_of({2: [(1, 1)]}, {1})):
        assert epochs_to_restore(listing, from_epoch, current) == expected


@pytest.mark.parametrize(
    ("batches", "after", "expected"),
    [
        ([], 0, False),
        ([(1, 3)], 0, True),
        ([(1, 3)], 3, False),
        ([(1, 3)], 2, True),
        ([(1, 3), (4, 4)], 3, True),
    ],
)
def test_needs_seal_read(batches: list[tuple[int, int]], after: int, expected: bool) -> None:
    listing = listing_of({2: batches}, {2})
    assert needs_seal_read(listing, 2, after) is expected
    assert needs_seal_read(listing, 1, after) is False


# --- the whole plan: plan_restore, choose_snapshot, proven_txid ----------------------------


@dataclass(frozen=True)
class Folder:
    """What a cell's folder holds, by meaning: batch spans per epoch, the ``max_txid`` of
    each seal, snapshots as (txid, epoch)."""

    batches: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    seals: dict[int, int] = field(default_factory=dict)
    snaps: list[tuple[int, int]] = field(default_factory=list)

    def keys(self) -> list[str]:
        listed = [keys.seal_key(CELL, e) for e in self.seals]
        listed += [keys.snapshot_key(CELL, t, e) for t, e in self.snaps]
        for e, spans_ in self.batches.items():
            listed += [keys.batch_key(CELL, e, a, b) for a, b in spans_]
        return listed

    def listing(self) -> Listing:
        return parse_listing(ROOT, self.keys())


def snap_key(txid: int, epoch: int) -> str:
    return keys.snapshot_key(CELL, txid, epoch)


def drive(
    listing: Listing,
    current: int,
    seal_values: dict[int, int],
    unusable: AbstractSet[str] = frozenset(),
) -> tuple[Plan | Hole, list[int]]:
    """Plan as the executor does: answer each :class:`NeedSeal` from ``seal_values`` and plan
    again. Returns the result and the epochs whose seals were asked for, in order."""
    seals: dict[int, int] = {}
    asked: list[int] = []
    for _ in range(len(listing.seals) + 1):
        result: PlanResult = plan_restore(listing, current, seals, unusable)
        assert not isinstance(result, Lagging), "no floor was given: a plan never lags"
        if not isinstance(result, NeedSeal):
            return result, asked
        assert result.epoch in listing.seals, f"asked for the unlisted seal of {result.epoch}"
        assert result.epoch not in seals, f"asked twice for the seal of {result.epoch}"
        seals[result.epoch] = seal_values[result.epoch]
        asked.append(result.epoch)
    raise AssertionError("the planner keeps asking for seals")


def plan_of(folder: Folder, current: int, unusable: AbstractSet[str] = frozenset()) -> Plan:
    result, _ = drive(folder.listing(), current, folder.seals, unusable)
    assert isinstance(result, Plan), result
    return result


def sealed(plan: Plan) -> list[tuple[int, int]]:
    return [(step.epoch, step.upto) for step in plan.seals]


def read_spans(plan: Plan) -> list[tuple[int, int, int]]:
    return [(step.epoch, r.first, r.last) for step in plan.steps for r in step.reads]


@pytest.mark.parametrize(
    ("folder", "current", "asked"),
    [
        pytest.param(Folder(), 4, [], id="nothing listed"),
        pytest.param(
            Folder({1: [(1, 3)], 2: [(4, 5)]}, {1: 3, 2: 5}),
            3,
            [2, 1],
            id="the newest seal first, then ascending",
        ),
        pytest.param(
            Folder({1: [(1, 3)], 3: [(4, 4)]}, {1: 3, 2: 3, 3: 4}),
            4,
            [3, 1],
            id="an empty sealed epoch is not read",
        ),
        pytest.param(
            Folder({1: [(1, 3)], 2: [(4, 6), (7, 8)], 3: [(9, 9)]}, {1: 3, 2: 8, 3: 9}, [(5, 2)]),
            4,
            [2, 3],
            id="the snapshot's epoch first; nothing below it",
        ),
        pytest.param(
            Folder({1: [(1, 5)], 2: [(6, 9)]}, {1: 5, 2: 7}, [(9, 2), (4, 1)]),
            3,
            [2, 1],
            id="a snapshot beyond its seal, then the next one's",
        ),
        pytest.param(
            Folder({1: [(1, 5)]}, {1: 5}, [(5, 1)]),
            2,
            [1],
            id="covered by the snapshot: only the snapshot's check",
        ),
        pytest.param(
            Folder({2: [(6, 7)]}, {}, [(5, 2)]), 3, [], id="unsealed snapshot epoch: no read"
        ),
        pytest.param(
            Folder({4: [(2, 2)]}, {1: 3, 2: 3}, [(1, 4)]),
            5,
            [],
            id="seals re-created below the snapshot are never read",
        ),
    ],
)
def test_need_seal_requests_in_order(folder: Folder, current: int, asked: list[int]) -> None:
    result, got = drive(folder.listing(), current, folder.seals)
    assert isinstance(result, Plan), result
    assert got == asked


@pytest.mark.parametrize(
    ("snaps", "listed", "read", "current", "unusable", "expected"),
    [
        pytest.param([], set(), {}, 3, set(), None, id="none listed"),
        pytest.param([(3, 1), (7, 2)], set(), {}, 3, set(), (7, 2), id="newest"),
        pytest.param([(5, 1), (5, 2)], set(), {}, 3, set(), (5, 2), id="tie: later epoch"),
        pytest.param([(7, 3), (3, 1)], set(), {}, 3, set(), (3, 1), id="at current skipped"),
        pytest.param([(7, 4), (3, 1)], set(), {}, 3, set(), (3, 1), id="above current skipped"),
        pytest.param([(7, 3), (8, 5)], set(), {}, 3, set(), None, id="all at or above current"),
        pytest.param([(7, 2)], {2}, {}, 3, set(), NeedSeal(2), id="sealed epoch: read first"),
        pytest.param([(7, 2)], {2}, {2: 7}, 3, set(), (7, 2), id="at its seal"),
        pytest.param([(9, 2), (4, 1)], {2}, {2: 7}, 3, set(), (4, 1), id="beyond its seal"),
        pytest.param(
            [(9, 2), (4, 1)], {1, 2}, {2: 7}, 3, set(), NeedSeal(1), id="beyond, next sealed"
        ),
        pytest.param([(9, 2), (4, 1)], set(), {}, 3, {(9, 2)}, (4, 1), id="unusable skipped"),
        pytest.param(
            [(9, 2), (4, 1)], {2}, {}, 3, {(9, 2)}, (4, 1), id="unusable: its seal not read"
        ),
        pytest.param([(9, 2)], set(), {}, 3, {(9, 2)}, None, id="only one, unusable"),
    ],
)
def test_choose_snapshot(
    snaps: list[tuple[int, int]],
    listed: set[int],
    read: dict[int, int],
    current: int,
    unusable: set[tuple[int, int]],
    expected: tuple[int, int] | NeedSeal | None,
) -> None:
    listing = Folder({}, dict.fromkeys(listed, 0), snaps).listing()
    got = choose_snapshot(listing, current, read, {snap_key(t, e) for t, e in unusable})
    if isinstance(expected, tuple):
        assert got == SnapshotRef(expected[0], expected[1], snap_key(*expected))
    else:
        assert got == expected


@pytest.mark.parametrize(
    ("folder", "current", "read", "expected"),
    [
        pytest.param(Folder(), 3, {}, 0, id="nothing"),
        pytest.param(Folder({}, {}, [(5, 1)]), 2, {}, 5, id="a snapshot"),
        pytest.param(Folder({}, {}, [(4, 1), (7, 2)]), 3, {}, 7, id="the newest snapshot"),
        pytest.param(Folder({}, {1: 5}, [(5, 1)]), 2, {1: 5}, 5, id="a snapshot at its seal"),
        pytest.param(
            Folder({}, {1: 5}, [(9, 1)]),
            2,
            {1: 5},
            5,
            id="a snapshot beyond its seal proves only the seal",
        ),
        pytest.param(Folder({1: [(1, 3)]}, {}), 2, {}, 0, id="epoch 1 starts at txid 1"),
        pytest.param(Folder({2: [(6, 8), (7, 9)]}, {}), 3, {}, 5, id="a first batch"),
        pytest.param(Folder({2: [(7, 9), (6, 6)]}, {}), 3, {}, 5, id="the lowest first batch"),
        pytest.param(
            Folder({1: [(1, 3)], 3: [(9, 9)]}, {}, [(4, 1)]), 4, {}, 8, id="the highest proof"
        ),
        pytest.param(
            Folder({1: [(1, 9)]}, {1: 9}, [(9, 1)]), 2, {}, 9, id="seals are not needed to prove"
        ),
    ],
)
def test_proven_txid(folder: Folder, current: int, read: dict[int, int], expected: int) -> None:
    assert proven_txid(folder.listing(), current, read) == expected


@pytest.mark.parametrize(
    ("folder", "current", "unusable", "words"),
    [
        pytest.param(Folder({1: [(2, 3)]}), 2, set(), "start at txid 2", id="gap at the start"),
        pytest.param(
            Folder({1: [(1, 3)], 2: [(6, 7)]}, {1: 3}),
            3,
            set(),
            "start at txid 6",
            id="gap at the start of a later unsealed epoch",
        ),
        pytest.param(
            Folder({1: [(1, 3), (5, 6)]}), 2, set(), "chain breaks after txid 3", id="gap inside"
        ),
        pytest.param(
            Folder({1: [(1, 3), (5, 6)], 3: []}),
            4,
            set(),
            "chain breaks after txid 3",
            id="gap inside an earlier unsealed epoch",
        ),
        pytest.param(
            Folder({1: [(1, 3)]}, {1: 5}),
            2,
            set(),
            "sealed at txid 5",
            id="sealed epoch ends below its seal",
        ),
        pytest.param(
            Folder({1: [(1, 2), (4, 6)]}, {1: 5}),
            2,
            set(),
            "sealed at txid 5",
            id="sealed epoch with a gap before its seal",
        ),
        pytest.param(
            Folder({2: [(6, 8)]}),
            3,
            set(),
            "seal is missing",
            id="GC race: below the snapshot deleted, snapshot not listed",
        ),
        pytest.param(
            Folder({3: [(9, 9)]}, {}, []),
            4,
            set(),
            "seal is missing",
            id="GC race: two epochs collected, snapshot not listed",
        ),
        pytest.param(
            Folder({2: [(6, 8)]}, {}, [(3, 1)]),
            3,
            set(),
            "seal is missing",
            id="GC race: an older snapshot listed, the newer one deleted",
        ),
        pytest.param(
            Folder({2: [(6, 7)]}, {}, [(5, 2)]),
            3,
            {(5, 2)},
            "seal is missing",
            id="newest snapshot unusable, chain below collected",
        ),
        pytest.param(
            Folder({}, {}, [(5, 2)]),
            3,
            {(5, 2)},
            "seal is missing",
            id="newest snapshot unusable, nothing written since",
        ),
        pytest.param(
            Folder({}, {}, [(5, 2), (2, 1)]),
            3,
            {(5, 2)},
            "seal is missing",
            id="newest snapshot unusable, an older one usable, the chain between collected",
        ),
        pytest.param(
            Folder({1: [(1, 3)], 3: [(8, 9)]}, {1: 3}),
            4,
            set(),
            "seal is missing",
            id="a later epoch proves more than an empty epoch before it",
        ),
    ],
)
def test_holes(folder: Folder, current: int, unusable: set[tuple[int, int]], words: str) -> None:
    result, _ = drive(folder.listing(), current, folder.seals, {snap_key(*s) for s in unusable})
    assert isinstance(result, Hole), result
    assert words in result.reason
    assert "missing" in result.reason or "rebuild only" in result.reason


@dataclass(frozen=True)
class Expect:
    last: int
    sealed: list[tuple[int, int]]
    reads: list[tuple[int, int, int]]
    snapshot: tuple[int, int] | None = None


@pytest.mark.parametrize(
    ("folder", "current", "unusable", "expect"),
    [
        pytest.param(Folder(), 1, set(), Expect(0, [], []), id="epoch 1: nothing to restore"),
        pytest.param(Folder(), 3, set(), Expect(0, [(1, 0), (2, 0)], []), id="a new cell"),
        pytest.param(
            Folder({1: [(1, 3), (4, 5)]}),
            2,
            set(),
            Expect(5, [(1, 5)], [(1, 1, 3), (1, 4, 5)]),
            id="an unacknowledged tail is sealed in whole",
        ),
        pytest.param(
            Folder({1: [(1, 3)], 2: [(4, 6)]}, {1: 3}),
            3,
            set(),
            Expect(6, [(2, 6)], [(1, 1, 3), (2, 4, 6)]),
            id="sealed history, then a tail",
        ),
        pytest.param(
            Folder({1: [(1, 3), (4, 5)], 2: [(4, 4)]}, {1: 3}),
            3,
            set(),
            Expect(4, [(2, 4)], [(1, 1, 3), (2, 4, 4)]),
            id="late appends beyond a seal are never read",
        ),
        pytest.param(
            Folder({1: [(1, 3), (4, 6)], 2: [(5, 5)]}, {1: 4}),
            3,
            set(),
            Expect(5, [(2, 5)], [(1, 1, 3), (1, 4, 6), (2, 5, 5)]),
            id="a seal that cuts a batch",
        ),
        pytest.param(
            Folder({1: [(1, 2), (1, 4), (3, 3), (5, 5)]}),
            2,
            set(),
            Expect(5, [(1, 5)], [(1, 1, 4), (1, 5, 5)]),
            id="overlapping retried batches",
        ),
        pytest.param(
            Folder({1: [(1, 3)], 4: [(4, 5)]}, {1: 3, 2: 3, 3: 3}),
            6,
            set(),
            Expect(5, [(4, 5), (5, 5)], [(1, 1, 3), (4, 4, 5)]),
            id="empty epochs, sealed or not",
        ),
        pytest.param(
            Folder({2: [(4, 6), (7, 8)]}, {}, [(5, 2)]),
            3,
            set(),
            Expect(8, [(2, 8)], [(2, 4, 6), (2, 7, 8)], (5, 2)),
            id="the snapshot's epoch starts below the snapshot",
        ),
        pytest.param(
            Folder({}, {}, [(5, 2)]),
            4,
            set(),
            Expect(5, [(2, 5), (3, 5)], [], (5, 2)),
            id="everything below the snapshot collected",
        ),
        pytest.param(
            Folder({1: [(4, 5)], 2: [(6, 6)]}, {1: 5}, [(5, 2)]),
            3,
            set(),
            Expect(6, [(2, 6)], [(2, 6, 6)], (5, 2)),
            id="a collection half done",
        ),
        pytest.param(
            Folder({1: [(1, 5), (6, 9)], 2: [(6, 7)]}, {1: 5}, [(9, 1)]),
            3,
            set(),
            Expect(7, [(2, 7)], [(1, 1, 5), (2, 6, 7)]),
            id="a fenced owner's snapshot beyond its seal is skipped",
        ),
        pytest.param(
            Folder({1: [(1, 3)], 2: [(4, 6), (7, 7)]}, {1: 3}, [(3, 1), (6, 2)]),
            3,
            set(),
            Expect(7, [(2, 7)], [(2, 7, 7)], (6, 2)),
            id="the newest of several snapshots",
        ),
        pytest.param(
            Folder({1: [(1, 5)]}, {}, [(5, 1)]),
            2,
            {(5, 1)},
            Expect(5, [(1, 5)], [(1, 1, 5)]),
            id="an unusable snapshot with the chain intact",
        ),
        pytest.param(
            Folder({1: [(1, 3)], 2: [(4, 6)]}, {1: 3, 2: 6}, [(6, 2)]),
            4,
            set(),
            Expect(6, [(3, 6)], [], (6, 2)),
            id="a sealed snapshot epoch with nothing beyond",
        ),
        pytest.param(
            # A deposed restore listed epochs 1-2 with a tail of txids (since dropped: the
            # cell's history sealed epoch 1 lower), stalled, and created their seals after
            # the collection of the snapshot's owner had deleted the first ones. Neither the
            # seals nor the txids they name are history: the plan never reads them.
            Folder({4: [(2, 2)]}, {1: 3, 2: 3}, [(1, 4)]),
            5,
            set(),
            Expect(2, [(4, 2)], [(4, 2, 2)], (1, 4)),
            id="seals re-created below the snapshot, above its history",
        ),
    ],
)
def test_plans(
    folder: Folder, current: int, unusable: set[tuple[int, int]], expect: Expect
) -> None:
    plan = plan_of(folder, current, {snap_key(*s) for s in unusable})
    assert plan.last_txid == expect.last
    assert sealed(plan) == expect.sealed
    assert read_spans(plan) == expect.reads
    assert plan.reads == tuple(r for step in plan.steps for r in step.reads)
    if expect.snapshot is None:
        assert plan.snapshot is None
    else:
        assert plan.snapshot == SnapshotRef(*expect.snapshot, snap_key(*expect.snapshot))


@pytest.mark.parametrize(
    "folder",
    [
        pytest.param(Folder({4: [(6, 7)]}, {}, [(5, 4)]), id="a later epoch's snapshot"),
        pytest.param(Folder({4: [(6, 7)]}, {3: 5}), id="a later epoch's batches, my seal"),
    ],
)
def test_superseded_restore_is_a_hole(folder: Folder) -> None:
    result, _ = drive(folder.listing(), 3, folder.seals)
    assert isinstance(result, Hole), result


@pytest.mark.parametrize(
    ("folder", "floor", "reached"),
    [
        pytest.param(Folder({1: [(1, 3)]}), 5, 3, id="the newest batches not listed yet"),
        pytest.param(Folder(), 2, 0, id="nothing listed yet"),
        pytest.param(Folder({1: [(1, 5)]}, {1: 5}), 7, 5, id="the released epoch unlisted"),
    ],
)
def test_a_plan_below_the_released_floor_lags(folder: Folder, floor: int, reached: int) -> None:
    """A release recorded ``floor`` acknowledged: a listing that rebuilds less lags, and
    nothing is sealed (without the floor, the shorter chain would be sealed for good)."""
    planned = plan_restore(folder.listing(), 3, dict(folder.seals), floor=floor)
    assert planned == Lagging(floor, reached)
    without = plan_restore(folder.listing(), 3, dict(folder.seals))
    assert isinstance(without, Plan) and without.last_txid == reached


def test_a_plan_that_reaches_the_floor_is_planned() -> None:
    folder = Folder({1: [(1, 3)], 2: [(4, 6)]}, {1: 3})
    planned = plan_restore(folder.listing(), 3, dict(folder.seals), floor=6)
    assert isinstance(planned, Plan) and planned.last_txid == 6
    assert sealed(planned) == [(2, 6)]


def test_sealed_epoch_with_every_batch_deleted_is_a_hole() -> None:
    folder = Folder({}, {1: 5})
    result, _ = drive(folder.listing(), 3, folder.seals)
    assert isinstance(result, Hole), result


@pytest.mark.parametrize(
    "folder",
    [
        pytest.param(
            Folder({1: [(6, 6)], 2: [(6, 7)]}, {}, [(7, 2), (5, 1)]),
            id="an acknowledged txid replaced by a fenced owner's",
        ),
        pytest.param(
            Folder({1: [(6, 6)]}, {}, [(5, 2), (5, 1)]),
            id="an unacknowledged txid restored",
        ),
    ],
)
def test_fallback_past_an_unusable_snapshot_into_a_collected_epoch(folder: Folder) -> None:
    newest = folder.listing().snapshots[0][2]
    result, _ = drive(folder.listing(), 3, folder.seals, {newest})
    assert isinstance(result, Hole), result


# --- property: random consistent histories ------------------------------------------------


@dataclass
class History:
    """A cell's folder after a random run of the protocol, and what it must restore to."""

    objects: dict[str, tuple[str, int, int]]  # key -> (kind, epoch, first txid or txid)
    seal_values: dict[int, int]  # epoch -> max_txid of every seal written (present or not)
    writer: dict[int, int]  # txid -> epoch whose batch holds it in the sealed history
    current: int
    durable: int  # the highest acknowledged (or restored, so sealed) txid
    end: int  # where a restore of everything listed ends
    realistic: bool  # every collection deleted in collect_garbage's order

    def listing(self, without: str = "") -> Listing:
        return parse_listing(ROOT, [k for k in self.objects if k != without])


@st.composite
def histories(draw: st.DrawFn) -> History:
    """Epochs one after another: each owner restores (sealing every unsealed epoch below at
    the end of the chain) and appends contiguous batches, or is claimed and never restores.
    Uploads may be retried (both attempts land), lost, or land late (after the next restore
    sealed their epoch, or at the very end). Owners snapshot acknowledged prefixes of their
    state; a snapshot may land late (after a takeover: its ownership check passed before),
    and its collection (the real :func:`collect_garbage`, possibly interrupted after any
    delete, or an arbitrary subset) deletes what it covers."""
    bucket = MemoryBucket("history")
    objects: dict[str, tuple[str, int, int]] = {}
    seal_values: dict[int, int] = {}
    writer: dict[int, int] = {}
    pos = durable = 0
    late_batches: list[tuple[int, int, int]] = []  # epoch, first, last
    orphans: list[tuple[int, int, int]] = []  # land at the very end
    late_snaps: list[tuple[int, int]] = []
    realistic = True

    def put(key: str, meta: tuple[str, int, int]) -> None:
        objects[key] = meta
        bucket.put(key, b"")

    def put_batch(epoch: int, first: int, last: int) -> None:
        put(keys.batch_key(CELL, epoch, first, last), ("batch", epoch, first))

    def land_snapshot(txid: int, epoch: int) -> None:
        nonlocal realistic
        put(snap_key(txid, epoch), ("snap", epoch, txid))
        how = draw(st.sampled_from(["none", "interrupted", "all", "any subset"]), label="gc")
        if how == "any subset":
            realistic = False
            covered = sorted(
                key
                for key, (kind, e, t) in objects.items()
                if (kind in ("batch", "seal") and e < epoch) or (kind == "snap" and t < txid)
            )
            for key in draw(st.lists(st.sampled_from(covered), unique=True)) if covered else []:
                bucket.delete(key)
        elif how != "none":
            stop = draw(st.integers(0, 12), label="deletes") if how == "interrupted" else 10**6
            checks = itertools.count()
            collect_garbage(
                bucket, CELL, epoch, txid, owns=lambda: True, cancelled=lambda: next(checks) > stop
            )
        for key in set(objects) - {info.key for info in bucket.list(ROOT)}:
            del objects[key]

    def maybe_snapshot(epoch: int, restored: int, acked: int) -> None:
        """The owner of ``epoch`` snapshots acknowledged state (never below its restore)."""
        if acked >= max(restored, 1) and draw(st.booleans(), label="snapshot"):
            txid = draw(st.integers(max(restored, 1), acked), label="snapshot txid")
            if draw(st.booleans(), label="snapshot lands late"):
                late_snaps.append((txid, epoch))
            else:
                land_snapshot(txid, epoch)

    epochs = draw(st.integers(1, 6), label="epochs")
    for epoch in range(1, epochs + 1):
        if epoch > 1 and draw(st.integers(0, 3), label="claimed only") == 0:
            continue
        for e in range(1, epoch):
            if e not in seal_values:
                seal_values[e] = pos
                put(keys.seal_key(CELL, e), ("seal", e, pos))
        for e, first, last in late_batches:
            put_batch(e, first, last)  # a fenced owner's upload, beyond its seal
        late_batches.clear()
        for snap in late_snaps:
            land_snapshot(*snap)
        late_snaps.clear()
        restored = acked = pos
        durable = max(durable, pos)
        maybe_snapshot(epoch, restored, acked)
        count = draw(st.integers(0, 3), label="batches")
        for i in range(count):
            size = draw(st.integers(1, 3), label="size")
            first, last = pos + 1, pos + size
            outcome = "acked"
            if i == count - 1:
                outcome = draw(st.sampled_from(["acked", "landed", "lost", "late", "orphan"]))
            if size > 1 and draw(st.booleans(), label="retried"):
                short = draw(st.integers(first, last - 1), label="first attempt")
                put_batch(epoch, first, short)  # the first attempt landed as well
                writer.update(dict.fromkeys(range(first, short + 1), epoch))
                pos = short
            if outcome in ("acked", "landed"):
                put_batch(epoch, first, last)
                writer.update(dict.fromkeys(range(first, last + 1), epoch))
                pos = last
                if outcome == "acked":
                    acked = durable = last
            elif outcome == "late":
                late_batches.append((epoch, first, last))
            elif outcome == "orphan":
                orphans.append((epoch, first, last))
            maybe_snapshot(epoch, restored, acked)
    for e, first, last in late_batches + orphans:
        put_batch(e, first, last)
        if e not in seal_values:  # its epoch is still unsealed: the tail
            writer.update(dict.fromkeys(range(first, last + 1), e))
            pos = max(pos, last)
    for snap in late_snaps:
        land_snapshot(*snap)
    return History(objects, seal_values, writer, epochs + 1, durable, pos, realistic)


def txid_sources(plan: Plan) -> dict[int, int]:
    """txid -> epoch of the batch the executor applies it from (as ``_apply`` does)."""
    got: dict[int, int] = {}
    pos = plan.snapshot.txid if plan.snapshot else 0
    for step in plan.steps:
        for ref in step.reads:
            for txid in range(ref.first, ref.last + 1):
                if pos < txid <= step.upto:
                    assert txid == pos + 1, (ref, pos)
                    got[txid] = step.epoch
                    pos = txid
        assert pos == step.upto, step
    return got


def evidence(h: History, listing: Listing) -> int:
    """What ``listing`` proves, computed from the definition: a snapshot proves its txid
    unless it lies beyond its own epoch's seal; an epoch's first batch at f proves f - 1."""
    proven = 0
    for txid, epoch, _key in listing.snapshots:
        if epoch < h.current and not (epoch in listing.seals and txid > h.seal_values[epoch]):
            proven = max(proven, txid)
    for epoch, refs in listing.batches.items():
        if epoch < h.current and refs:
            proven = max(proven, min(r.first for r in refs) - 1)
    return proven


def silent_loss_allowed(h: History, gone: str, plan: Plan, full: Plan) -> str | None:
    """Why deleting ``gone`` may shorten the restore without the listing showing it: the
    deleted object was the only evidence. None when it is not allowed."""
    kind, epoch, first = h.objects[gone]
    if full.snapshot is not None and gone == full.snapshot.key:
        return "the snapshot, the only record of what it covers"
    if kind != "batch":
        return None
    rest = [v for k, v in h.objects.items() if k != gone and v[0] == "batch"]
    if any(e > epoch for _, e, _ in rest if e < h.current):
        return None  # a later epoch's first batch proves more
    if any(e == epoch and f > first for _, e, f in rest):
        return None  # a gap in the chain
    if keys.seal_key(CELL, epoch) not in h.objects:
        return "the tail of the last epoch (indistinguishable from an unacknowledged one)"
    if all(step.epoch != epoch for step in plan.steps):
        # Known gap, see test_sealed_epoch_with_every_batch_deleted_is_a_hole.
        return "KNOWN GAP: every batch of a sealed epoch gone; its seal is never read"
    return None


@settings(
    max_examples=600,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(histories())
def test_random_histories_restore_every_acknowledged_write(h: History) -> None:
    listing = h.listing()
    result, asked = drive(listing, h.current, h.seal_values)
    assert isinstance(result, Plan), result
    full = result
    # The whole listing: no hole, and the restore ends exactly where the history does.
    assert full.last_txid == h.end >= h.durable
    start = full.snapshot.epoch if full.snapshot else 1
    assert [s.epoch for s in full.seals] == [
        e for e in range(start, h.current) if e not in listing.seals
    ]
    for txid, epoch in txid_sources(full).items():
        assert h.writer[txid] == epoch, f"txid {txid} read from epoch {epoch}'s batch"
    assert not [s.epoch for s in full.seals if s.epoch in h.seal_values], "a seal re-created"
    event(f"snapshot used: {full.snapshot is not None}")
    event(f"epochs sealed by the plan: {min(len(full.seals), 2)}")

    # Delete any one object the plan reads: a hole, or a plan that still reaches every
    # acknowledged txid, or one the remaining listing cannot tell apart (never one that
    # ends below what the remaining listing proves).
    read = [ref.key for ref in full.reads] + [keys.seal_key(CELL, e) for e in asked]
    if full.snapshot is not None:
        read.append(full.snapshot.key)
    for gone in read:
        rest = h.listing(without=gone)
        damaged, _ = drive(rest, h.current, h.seal_values)
        if isinstance(damaged, Hole):
            event("one object deleted: a hole")
            continue
        assert damaged.last_txid >= evidence(h, rest), (gone, damaged)
        if damaged.last_txid >= h.durable:
            event("one object deleted: still reaches every acknowledged write")
            continue
        why = silent_loss_allowed(h, gone, damaged, full)
        assert why is not None, (
            f"deleting {gone} restores only through txid {damaged.last_txid}, not "
            f"{h.durable}, and no hole was found: {damaged}"
        )
        event(f"one object deleted: undetectable ({why.split(',')[0]})")

    # The snapshot found corrupt instead (still listed, so still a proof): a hole, or the
    # whole history from an older snapshot and the chain.
    if full.snapshot is not None and h.realistic:
        result, _ = drive(listing, h.current, h.seal_values, {full.snapshot.key})
        if isinstance(result, Hole):
            event("snapshot unusable: a hole")
        elif any(step.epoch in h.seal_values for step in result.seals):
            # Known bug, see test_fallback_past_an_unusable_snapshot_into_a_collected_epoch.
            event("snapshot unusable: KNOWN BUG, a collected epoch re-sealed")
        else:
            assert result.last_txid == h.end, result
            for txid, epoch in txid_sources(result).items():
                assert h.writer[txid] == epoch, f"txid {txid} read from epoch {epoch}'s batch"
            event("snapshot unusable: restored")
