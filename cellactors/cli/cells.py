"""``cellactors cells``: list cells with their size, epoch, owner and last activity, from
the bucket alone (nothing is activated, nothing written), a page at a time."""

from __future__ import annotations

import datetime
import json
from dataclasses import asdict

import click

from cellactors.cli.failures import CommandFailed, store_failure
from cellactors.cli.store_options import StoreArgs, store_options
from cellactors.errors import BucketError, InvalidCellId
from cellactors.persistence.control.cell_listing import CellInfo, CellPage, list_cells


def _when(ms: int | None) -> str:
    if ms is None:
        return "-"
    stamp = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.timezone.utc)
    return stamp.strftime("%Y-%m-%dT%H:%M:%SZ")


def _row(c: CellInfo) -> list[str]:
    epoch = "-" if c.epoch is None else str(c.epoch)
    owner = "(purging)" if c.purging else (c.owner or "(released)")
    if c.epoch is None:
        owner = "(no own.json)"
    acked = "-" if c.acked_txid is None else str(c.acked_txid)
    return [
        c.cell,
        owner,
        epoch,
        acked,
        str(c.objects),
        str(c.size_bytes),
        _when(c.last_activity_ms),
    ]


def render_text(page: CellPage) -> str:
    """The page as an aligned table, with the next cursor if there is one."""
    header = ["CELL", "OWNER", "EPOCH", "ACKED", "OBJECTS", "BYTES", "LAST ACTIVITY"]
    rows = [header, *(_row(c) for c in page.cells)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    if page.next_after is not None:
        lines += ["", f"more cells: --after {page.next_after}"]
    return "\n".join(lines)


@click.command("cells")
@store_options()
@click.option("--class", "cls", default=None, metavar="CLASS", help="Only cells of this class.")
@click.option(
    "--limit", default=100, show_default=True, type=click.IntRange(min=1), help="Cells per page."
)
@click.option(
    "--after",
    default="",
    metavar="CELL",
    help="Start after this cell id (the cursor a previous page printed).",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON document instead of a table.")
def cells(store: StoreArgs, cls: str | None, limit: int, after: str, as_json: bool) -> None:
    """List cells (owner, epoch, acknowledged txid, objects, bytes, last activity) as the
    bucket records them; read-only, activates nothing."""
    bucket = store.open()
    try:
        page = list_cells(bucket, cls, limit, after)
    except InvalidCellId as err:
        raise CommandFailed(str(err)) from err
    except BucketError as err:
        raise store_failure(err, store.bucket) from err
    finally:
        bucket.close()
    if as_json:
        click.echo(json.dumps(asdict(page), indent=2, sort_keys=True))
    else:
        click.echo(render_text(page))
