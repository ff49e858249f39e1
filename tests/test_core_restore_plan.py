"""Table-driven tests of :mod:`cellactors.core.restore_plan` (PROTOCOL.md, "Restore and the
epoch seal")."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cellactors.core.restore_plan import (
    BatchRef,
    EpochStep,
    Listing,
    chain,
    epochs_to_restore,
    needs_seal_read,
    parse_listing,
    plan_epoch,
)
from cellactors.persistence import keys

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
