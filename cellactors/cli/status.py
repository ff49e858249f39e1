"""``cellactors status``: the fleet as the bucket records it, read by anyone with read
access and no running node.

Nodes come from their leases (``nodes/<node>.json``): address, load, how long ago the lease
was written and when it expires by this machine's clock (alive or expired). Cells come from
their ownership records (``cells/<cell>/own.json``), a page at a time (``--limit``,
``--after``), each with its owner, epoch and whether that owner's lease is alive. It writes
nothing.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

import click

from cellactors.cli.failures import CommandFailed, store_failure
from cellactors.cli.store_options import StoreArgs, store_options
from cellactors.core import keys
from cellactors.errors import BucketError, InvalidCellId
from cellactors.persistence.control.leases import ListedLease, list_leases
from cellactors.persistence.control.ownership import OwnershipStore
from cellactors.persistence.store.bucket import Bucket

CELLS_PREFIX = "cells/"


@dataclass(frozen=True)
class NodeRow:
    """One node lease as shown."""

    node: str
    state: str  # alive | expired | stopped (drained: expires_ms 0) | unreadable
    addr: str
    age_s: float  # since the lease was last written
    expires_in_s: float | None  # negative once expired
    load: dict[str, Any]
    generation: str
    problem: str | None = None


@dataclass(frozen=True)
class CellRow:
    """One cell's ownership record as shown."""

    cell: str
    owner: str  # empty when released
    epoch: int | None
    state: str  # owned | orphaned (owner's lease expired) | released | purging | unreadable
    problem: str | None = None


@dataclass(frozen=True)
class FleetStatus:
    """A snapshot of the fleet as the bucket records it; ``next_after`` is the ``--after``
    cursor of the next page of cells, or None on the last page."""

    bucket: str
    at_ms: int
    nodes: list[NodeRow]
    cells: list[CellRow]
    next_after: str | None


def _node_row(listed: ListedLease, at: int) -> NodeRow:
    age = max(0, at - listed.written_ms) / 1000
    lease = listed.lease
    if lease is None:
        return NodeRow(listed.node, "unreadable", "", age, None, {}, "", listed.problem)
    state = "alive" if lease.is_live(at) else "expired"
    if lease.expires_ms == 0:
        state = "stopped"
    expires = (lease.expires_ms - at) / 1000 if lease.expires_ms else None
    return NodeRow(lease.node, state, lease.addr, age, expires, lease.load, lease.generation)


def _cell_rows(
    bucket: Bucket, limit: int, after: str, alive: set[str]
) -> tuple[list[CellRow], str | None]:
    owners = OwnershipStore(bucket, "status")
    rows: list[CellRow] = []
    for name in bucket.list_folders(CELLS_PREFIX, after):
        try:
            keys.validate_cell_id(name)
        except InvalidCellId:
            continue  # not a cell folder
        if len(rows) == limit:
            return rows, rows[-1].cell
        try:
            record = owners.read_owner(name)
        except BucketError as err:
            if type(err) is not BucketError:
                raise  # credentials, unreachable: the whole command fails
            rows.append(CellRow(name, "", None, "unreadable", str(err)))
            continue
        if record is None:
            continue  # a cell folder without own.json (being deleted, or never owned)
        state = "owned" if record.node in alive else "orphaned"
        if record.released:
            state = "released"
        if record.purging:
            state = "purging"  # a purge (or a clone being built) holds it: calls are refused
        rows.append(CellRow(name, record.node, record.epoch, state))
    return rows, None


def read_status(bucket: Bucket, limit: int, after: str = "") -> FleetStatus:
    """Read the leases and one page of cells."""
    listed = list_leases(bucket)
    at = bucket.clock.now_ms()  # the store's time, as its answers just showed it
    nodes = [_node_row(item, at) for item in listed]
    alive = {n.node for n in nodes if n.state == "alive"}
    cells, next_after = _cell_rows(bucket, limit, after, alive)
    return FleetStatus(bucket.spec, at, nodes, cells, next_after)


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}s"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return [
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
        for r in [header, *rows]
    ]


def render_text(status: FleetStatus) -> str:
    """The status as two aligned tables."""
    lines = [f"fleet {status.bucket}", "", f"nodes ({len(status.nodes)})"]
    node_rows = [
        [
            n.node,
            n.state,
            n.addr or "-",
            _seconds(n.age_s),
            _seconds(n.expires_in_s),
            " ".join(f"{k}={v}" for k, v in sorted(n.load.items())) or n.problem or "-",
        ]
        for n in status.nodes
    ]
    lines += _table(["NODE", "STATE", "ADDRESS", "WRITTEN", "EXPIRES IN", "LOAD"], node_rows)
    lines += ["", f"cells ({len(status.cells)} shown)"]
    cell_rows = [
        [c.cell, c.owner or "-", "-" if c.epoch is None else str(c.epoch), c.state]
        for c in status.cells
    ]
    lines += _table(["CELL", "OWNER", "EPOCH", "STATE"], cell_rows)
    if status.next_after is not None:
        lines += ["", f"more cells: --after {status.next_after}"]
    return "\n".join(lines)


@click.command("status")
@store_options()
@click.option(
    "--limit",
    default=100,
    show_default=True,
    type=click.IntRange(min=1),
    help="Cells per page.",
)
@click.option(
    "--after",
    default="",
    metavar="CELL",
    help="Start after this cell id (the cursor a previous page printed).",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON document instead of tables.")
def status(store: StoreArgs, limit: int, after: str, as_json: bool) -> None:
    """Show the nodes (leases) and cells (owners, epochs) the bucket records; read-only.

    Ages and expiries are computed with this machine's clock."""
    if after:
        try:
            keys.validate_cell_id(after)
        except InvalidCellId as err:
            raise CommandFailed(f"--after: {err}") from err
    bucket = store.open()
    try:
        result = read_status(bucket, limit, after)
    except BucketError as err:
        raise store_failure(err, store.bucket) from err
    finally:
        bucket.close()
    if as_json:
        click.echo(json.dumps(asdict(result), indent=2, sort_keys=True))
    else:
        click.echo(render_text(result))
