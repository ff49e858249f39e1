"""Local file names of cells: every valid cell id (1-255 bytes) activates at every epoch,
because its file's name always fits in 255 bytes with SQLite's suffixes; long ids are named by
a digest, and no two ids ever share a file."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from cellactors.core import keys
from cellactors.core.types import Absent, Applied
from cellactors.errors import InvalidCellId
from cellactors.persistence.celldb.database import CellDatabase
from cellactors.persistence.control.ownership import OwnershipStore
from cellactors.persistence.history.snapshots import encode_snapshot
from cellactors.persistence.store.s3 import S3Bucket
from tests.helpers.cells import Counter
from tests.helpers.runtime import crash, eventually, make_node, owner_epoch

PREFIX = "Counter:"
#: The longest SQLite suffix of a database file (a rollback journal).
JOURNAL = "-journal"
EPOCHS = (1, 9, 10, 10**9, 2**63 - 1, 2**63)


def cell_id_of(length: int, fill: str = "x") -> str:
    return PREFIX + fill * (length - len(PREFIX))


@pytest.mark.parametrize("length", [9, 200, 215, 216, 233, 234, 245, 246, 254, 255])
@pytest.mark.parametrize("epoch", EPOCHS)
def test_every_name_fits_with_sqlites_suffixes(length: int, epoch: int, tmp_path: Path) -> None:
    cell_id = cell_id_of(length)
    name = keys.local_db_name(cell_id, epoch)
    assert len((name + JOURNAL).encode()) <= keys.LOCAL_NAME_MAX
    assert name.endswith(f".e{epoch}.db")
    # The filesystem agrees, with every file SQLite makes beside a database.
    for suffix in ("", JOURNAL, "-wal", "-shm"):
        (tmp_path / (name + suffix)).write_bytes(b"")


def test_short_ids_name_their_files_themselves_at_every_epoch() -> None:
    cell_id = cell_id_of(keys.LOCAL_ID_MAX)
    for epoch in EPOCHS:
        assert keys.local_db_name(cell_id, epoch) == f"{cell_id}.e{epoch}.db"
    assert keys.local_db_name("Counter:a", 3) == "Counter:a.e3.db"


def test_long_ids_are_named_by_a_digest_that_no_short_name_can_equal() -> None:
    long_id = cell_id_of(255)
    name = keys.local_db_name(long_id, 7)
    assert name.startswith("Counter#") and ":" not in name
    # A cell id always holds a ":": no id, however chosen, is named like a digest.
    stem = name[: -len(".e7.db")]
    with pytest.raises(InvalidCellId):
        keys.validate_cell_id(stem)


def test_no_two_ids_share_a_file() -> None:
    """Ids that differ only near their end (where a cut name would lose them), at the
    lengths where the short form turns into the digest form, and ids that end like an
    epoch suffix: every (id, epoch) pair has its own name."""
    ids = [
        cell_id_of(length - 1) + last
        for length in (200, 233, 234, 246, 255)
        for last in ("a", "b", ":", ".")
    ]
    ids += ["Counter:a", "Counter:a.e1", "Counter:a.e1.db", "Cou:nter", "Counter:" + "y" * 247]
    names = [keys.local_db_name(i, e) for i, e in itertools.product(ids, EPOCHS)]
    assert len(set(names)) == len(names)


def test_a_cell_file_can_be_created_under_a_digest_name(tmp_path: Path) -> None:
    db = CellDatabase(tmp_path / keys.local_db_name(cell_id_of(255), 2**63))
    db.conn.execute("CREATE TABLE t (x)")
    db.conn.execute("PRAGMA journal_mode = DELETE")  # a journal file on disk, too
    db.conn.execute("INSERT INTO t VALUES (1)")
    assert db.conn.execute("SELECT x FROM t").fetchall() == [(1,)]
    db.discard()
    assert list(tmp_path.iterdir()) == []


def start_high(bucket: S3Bucket, cell_id: str, epoch: int, tmp_path: Path) -> None:
    """Make ``cell_id`` a released cell at ``epoch`` whose history starts with a snapshot
    there (a restore at ``epoch + 1`` then reads one epoch, not 2**63 of them)."""
    empty = CellDatabase(tmp_path / "empty.db")
    image = empty.image()
    empty.discard()
    bucket.put(keys.snapshot_key(cell_id, 1, epoch), encode_snapshot(cell_id, epoch, 1, image))
    setup = OwnershipStore(bucket, "setup")
    assert isinstance(setup.cas_owner(cell_id, Absent(), epoch), Applied)
    assert isinstance(setup.release_owner(cell_id, epoch, 1), Applied)


@pytest.mark.parametrize("length", [200, 246, 254, 255])
@pytest.mark.parametrize("first_epoch", [1, 2**63 - 3], ids=["epoch1", "huge-epoch"])
def test_long_ids_activate_passivate_hibernate_and_move(
    sw_bucket: S3Bucket, tmp_path: Path, length: int, first_epoch: int
) -> None:
    """A cell with a ``length``-byte id writes, hibernates and resumes from its own file,
    passivates and reuses its local copy, then survives a takeover; from epoch 1, and from
    a huge epoch up to 2**63."""
    name = "n" * (length - len(PREFIX))
    cell_id = PREFIX + name
    if first_epoch > 1:
        start_high(sw_bucket, cell_id, first_epoch - 1, tmp_path)
    a = make_node(sw_bucket, "la")
    b = make_node(sw_bucket, "lb")
    try:
        cell = a.cell(Counter, name)
        assert cell.increment("x") == 1
        assert owner_epoch(a, cell_id) == ("la", first_epoch)
        files = [p.name for p in a.cells_dir.iterdir()]
        assert files == [keys.local_db_name(cell_id, first_epoch)]

        assert a.hibernate(cell_id)
        assert cell.increment("x") == 2
        assert a.state()["cells"][0]["restored_from"] == "hibernated"

        assert a.passivate(cell_id)
        eventually(lambda: a.activations.local_copy(cell_id) is not None, timeout=5)
        assert cell.increment("x") == 3
        assert a.state()["cells"][0]["restored_from"] == "local"
        assert owner_epoch(a, cell_id) == ("la", first_epoch + 1)

        crash(a, sw_bucket)
        assert b.cell(Counter, name).increment("x") == 4
        assert b.state()["cells"][0]["restored_from"] == "bucket"
        assert owner_epoch(b, cell_id) == ("lb", first_epoch + 2)

        assert b.passivate(cell_id)
        eventually(lambda: b.activations.local_copy(cell_id) is not None, timeout=5)
        assert b.cell(Counter, name).get("x") == 4
        assert owner_epoch(b, cell_id) == ("lb", first_epoch + 3)
        assert [p.name for p in b.cells_dir.iterdir()] == [
            keys.local_db_name(cell_id, first_epoch + 3)
        ]
    finally:
        a.stop()
        b.stop()
