"""Pragmas in write methods: the ones stored in the file's header are replicated like a
schema change, the ones the runtime depends on are refused, and per-connection ones stay
per connection."""

from __future__ import annotations

from typing import Any

import pytest

from cellactors import CellActor, read_only
from cellactors.core.txn import Txn
from cellactors.errors import MethodFailed
from cellactors.persistence.store.s3 import S3Bucket
from tests.helpers.runtime import active_of, crash, make_node


class Versioned(CellActor):
    """Migrations keyed on ``PRAGMA user_version``, the usual SQLite idiom."""

    def on_activate(self) -> None:
        self.db.execute("CREATE TABLE IF NOT EXISTS t (k TEXT PRIMARY KEY, v INTEGER)")

    def set_pragma(self, name: str, value: str) -> None:
        self.db.execute(f"PRAGMA {name} = {value}")

    def put(self, k: str, v: int) -> None:
        self.db.execute("INSERT OR REPLACE INTO t VALUES (?, ?)", [k, v])

    @read_only
    def pragma(self, name: str) -> int:
        return int(self.db.execute(f"PRAGMA {name}").fetchone()[0])


def test_a_header_pragma_set_in_a_write_is_replicated(sw_bucket: S3Bucket) -> None:
    a = make_node(sw_bucket, "na")
    a.register(Versioned)
    b = make_node(sw_bucket, "nb")
    b.register(Versioned)
    try:
        a.call("Versioned", "v", "set_pragma", {"name": "user_version", "value": "7"})
        a.call("Versioned", "v", "set_pragma", {"name": "application_id", "value": "42"})
        a.call("Versioned", "v", "put", {"k": "x", "v": 1})  # a later plain write
        crash(a, sw_bucket)
        # The new owner restores from the bucket alone: the header came with the images.
        assert b.call("Versioned", "v", "pragma", {"name": "user_version"}) == 7
        assert b.call("Versioned", "v", "pragma", {"name": "application_id"}) == 42
    finally:
        a.stop()
        b.stop()


def test_a_header_pragma_that_changes_ships_an_image_and_a_plain_write_does_not(
    sw_bucket: S3Bucket,
) -> None:
    a = make_node(sw_bucket, "na")
    a.register(Versioned)
    try:
        a.call("Versioned", "v", "put", {"k": "x", "v": 1})
        active = active_of(a, "Versioned:v")
        assert active is not None
        shipped: list[bool] = []
        commit = active.runtime.channel.commit

        def spy(txn: Txn, effect: Any = None, trace: Any = None, pushes: Any = None) -> None:
            shipped.append(txn.image is not None)
            commit(txn, effect, trace, pushes)

        active.runtime.channel.commit = spy  # type: ignore[method-assign]
        a.call("Versioned", "v", "put", {"k": "x", "v": 2})
        a.call("Versioned", "v", "set_pragma", {"name": "user_version", "value": "3"})
        assert shipped == [False, True]
        # Setting the value it already has changes nothing: no transaction to ship.
        a.call("Versioned", "v", "set_pragma", {"name": "user_version", "value": "3"})
        assert shipped == [False, True]
        a.call("Versioned", "v", "set_pragma", {"name": "application_id", "value": "5"})
        assert shipped == [False, True, True]
    finally:
        a.stop()


@pytest.mark.parametrize(
    ("name", "value", "reason"),
    [
        ("journal_mode", "WAL", "owns the database's journal"),
        ("schema_version", "99", "corrupts replication"),
        ("writable_schema", "1", "not replicated"),
        # A full or read-only database is the node's storage fault: code may not fake one.
        ("max_page_count", "1", "owns the database's size limit"),
        ("query_only", "1", "owns whether the database is writable"),
    ],
)
def test_pragmas_the_runtime_depends_on_are_refused(
    sw_bucket: S3Bucket, name: str, value: str, reason: str
) -> None:
    a = make_node(sw_bucket, "na")
    a.register(Versioned)
    try:
        with pytest.raises(MethodFailed, match=reason):
            a.call("Versioned", "v", "set_pragma", {"name": name, "value": value})
        assert a.call("Versioned", "v", "pragma", {"name": "user_version"}) == 0
        a.call("Versioned", "v", "put", {"k": "x", "v": 1})  # the cell is unharmed
    finally:
        a.stop()
