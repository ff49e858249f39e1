"""Listing cells from the bucket alone, without activating any: one page at a time.

Each row comes from the cell's ``own.json`` (owner, epoch, acknowledged txid) and the
listing of its folder (how many objects, their total size, and the newest object's
``LastModified`` as its last activity). The cells themselves come from a delimiter listing
of ``cells/`` (or ``cells/<Class>:``) that starts at the cursor, so a page costs one folder
listing plus, per cell, one GET and one LIST (one per 1000 objects of it).
"""

from __future__ import annotations

from dataclasses import dataclass

from cellactors.core import keys
from cellactors.errors import InvalidCellId
from cellactors.persistence.control.ownership import OwnershipStore
from cellactors.persistence.store.bucket import Bucket

CELLS_PREFIX = "cells/"


@dataclass(frozen=True)
class CellInfo:
    """One cell as the bucket records it. ``owner`` is empty when the cell is released;
    ``epoch`` and ``acked_txid`` are None when its folder has no ``own.json`` (a purge
    under way, or objects of a cell never owned); ``last_activity_ms`` is None for an
    empty folder."""

    cell: str
    owner: str
    epoch: int | None
    acked_txid: int | None
    purging: bool
    objects: int
    size_bytes: int
    last_activity_ms: int | None


@dataclass(frozen=True)
class CellPage:
    """One page of cells; ``next_after`` is the cursor of the next page (None: last)."""

    cells: list[CellInfo]
    next_after: str | None


def cell_info(bucket: Bucket, cell_id: str) -> CellInfo:
    """Read one cell's row: its ``own.json`` and the listing of its folder."""
    record = OwnershipStore(bucket, "list").read_owner(cell_id)
    count = size = 0
    newest: int | None = None
    for info in bucket.list(keys.cell_root(cell_id)):
        count += 1
        size += info.size
        newest = info.last_modified_ms if newest is None else max(newest, info.last_modified_ms)
    return CellInfo(
        cell=cell_id,
        owner=record.node if record else "",
        epoch=record.epoch if record else None,
        acked_txid=record.acked_txid if record else None,
        purging=bool(record and record.purging),
        objects=count,
        size_bytes=size,
        last_activity_ms=newest,
    )


def list_cells(
    bucket: Bucket, cls: str | None = None, limit: int = 100, after: str = ""
) -> CellPage:
    """A page of at most ``limit`` cells (of class ``cls`` if given) in id order, starting
    after cell id ``after``. Reads only; activates nothing."""
    if limit < 1:
        raise ValueError("limit must be at least 1")
    if after:
        keys.validate_cell_id(after)
    prefix = CELLS_PREFIX
    start = after
    if cls is not None:
        keys.make_cell_id(cls, "x")  # validates the class name
        prefix = f"{CELLS_PREFIX}{cls}:"
        if after:
            start = after[len(cls) + 1 :] if after.startswith(f"{cls}:") else ""
            if not start and after > f"{cls}:":
                return CellPage([], None)  # the cursor is past every cell of the class
    rows: list[CellInfo] = []
    folders = bucket.list_folders(prefix, start)
    try:
        for name in folders:
            cell_id = prefix[len(CELLS_PREFIX) :] + name
            try:
                keys.validate_cell_id(cell_id)
            except InvalidCellId:
                continue  # not a cell folder
            if len(rows) == limit:
                return CellPage(rows, rows[-1].cell)
            rows.append(cell_info(bucket, cell_id))
    finally:
        close = getattr(folders, "close", None)
        if close is not None:
            close()
    return CellPage(rows, None)
