"""The ledger checker catches each violation it claims to (pure checks, no fleet)."""

from __future__ import annotations

import json

import pytest

from tests.faults.ledger import Attempt, entry_violations, ownership_violations
from tests.faults.proxy import Request

pytestmark = pytest.mark.faults

KEY = "cells/Ledger:a/own.json"


def attempt(entry: str, done: float, *, ok: bool = True, outcome: str | None = None) -> Attempt:
    seq = entry.rsplit("-", 1)[0]
    status = 200 if ok else 503
    return Attempt(entry, seq, "u", done - 0.1, done, status, "n", None if ok else outcome)


def test_a_clean_ledger_passes() -> None:
    attempts = [
        attempt("w-0", 1),
        attempt("w-1", 2),
        attempt("w-2", 3, ok=False, outcome="unknown"),
    ]
    assert entry_violations("x", ["w-0", "w-1", "w-2"], attempts) == []
    assert entry_violations("x", ["w-0", "w-1"], attempts) == []


def test_each_entry_violation_is_reported() -> None:
    attempts = [
        attempt("w-0", 1),
        attempt("w-1", 2),
        attempt("w-2", 3),
        attempt("w-3", 4, ok=False, outcome="not_run"),
    ]
    assert "acknowledged but missing ['w-1']" in entry_violations("x", ["w-0", "w-2"], attempts)[0]
    (reorder,) = entry_violations("x", ["w-1", "w-0", "w-2"], attempts)
    assert "out of ledger order" in reorder
    (dupe,) = entry_violations("x", ["w-0", "w-1", "w-1", "w-2"], attempts)
    assert "duplicate" in dupe
    (ghost,) = entry_violations("x", ["w-0", "w-1", "w-2", "w-3"], attempts)
    assert "not_run" in ghost
    twice = [*attempts, attempt("w-4", 5, ok=False, outcome="failed")]
    (rolled_back,) = entry_violations("x", ["w-0", "w-1", "w-2", "w-4"], twice)
    assert "said failed" in rolled_back
    (stranger,) = entry_violations("x", ["w-0", "w-1", "w-2", "zz"], attempts)
    assert "nobody sent" in stranger


def own(
    proxy: str, node: str, epoch: int, etag: str, *, match: str | None = None, seq: int = 0
) -> Request:
    return Request(
        seq=seq,
        proxy=proxy,
        method="PUT",
        kind="own",
        key=KEY,
        query="",
        arrived=float(seq),
        store_status=200,
        if_match=match,
        if_none_match=None if match else "*",
        etag=f'"{etag}"',
        body=json.dumps({"node": node, "epoch": epoch}).encode(),
    )


def test_ownership_history_in_store_order_passes() -> None:
    history = [
        own("a", "a", 1, "e1"),
        own("a", "", 1, "e2", match='"e1"'),
        own("b", "b", 2, "e3", match="e2"),  # the S3 dialect may send the bare spelling
        own("c", "c", 3, "e4", match='"e3"'),
    ]
    # Proxies log in their own arrival order; the checker orders by the guards.
    assert ownership_violations(reversed(history)) == []


def test_two_owners_of_one_epoch_and_going_back_are_reported() -> None:
    problems = ownership_violations([own("a", "a", 1, "e1"), own("b", "b", 1, "e2", match="e1")])
    assert any("epoch 1 owned by ['a', 'b']" in p for p in problems)
    assert any("epoch 1 by b after epoch 1" in p for p in problems)
    backwards = ownership_violations([own("a", "a", 3, "e1"), own("b", "b", 2, "e2", match="e1")])
    assert any("epoch 2 by b after epoch 3" in p for p in backwards)


def test_forks_foreign_releases_and_wrong_proxies_are_reported() -> None:
    fork = ownership_violations(
        [
            own("a", "a", 1, "e1"),
            own("b", "b", 2, "e2", match="e1"),
            own("c", "c", 2, "e3", match="e1"),
        ]
    )
    assert any("2 conditional writes applied on one version" in p for p in fork)
    foreign = ownership_violations([own("a", "a", 1, "e1"), own("b", "", 1, "e2", match="e1")])
    assert any("release of epoch 1 through b" in p for p in foreign)
    spoofed = ownership_violations([own("a", "b", 1, "e1")])
    assert any("written through the proxy of a" in p for p in spoofed)
    unapplied = own("b", "b", 1, "e9", match="e1")
    unapplied.store_status = 412
    assert ownership_violations([own("a", "a", 1, "e1"), unapplied]) == []
