"""``cellactors purge``: delete one cell and every object of it from the bucket, fenced
(:mod:`cellactors.persistence.control.purge`); the next call finds an empty new cell."""

from __future__ import annotations

import click

from cellactors.cli.failures import EXIT_FAILURE, CommandFailed, store_failure
from cellactors.cli.store_options import StoreArgs, store_options
from cellactors.core import keys
from cellactors.errors import BucketError, InvalidCellId
from cellactors.persistence.control.purge import live_owner, purge_cell


@click.command("purge")
@store_options()
@click.option("--cell", "cell_id", required=True, metavar="CLASS:NAME", help="e.g. Counter:a")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.option(
    "--settle",
    default=2.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Seconds to wait before the last listing, for a write the fenced owner had in "
    "flight to land (and be deleted).",
)
@click.option(
    "--fence-live",
    is_flag=True,
    help="Purge even if a live node owns the cell: it is fenced, the history deleted, and "
    "own.json left marked purging until a second run finishes (see protocol.md). Without it "
    "such a cell is refused: purge it through that node's DELETE /cells/{cls}/{name}.",
)
def purge(store: StoreArgs, cell_id: str, yes: bool, settle: float, fence_live: bool) -> None:
    """Delete the cell's data for good: its batches, seals, snapshots, wake entries and
    own.json. Its owner, if any, is fenced first. Not undoable."""
    try:
        keys.validate_cell_id(cell_id)
    except InvalidCellId as err:
        raise CommandFailed(str(err)) from err
    if not yes:
        click.confirm(f"delete {cell_id} and all its history for good?", abort=True)
    bucket = store.open()
    try:
        owner = None if fence_live else live_owner(bucket, cell_id)
        if owner is not None:
            raise CommandFailed(
                f"{cell_id} is owned by live node {owner}: purge it through that node, or "
                "pass --fence-live",
                EXIT_FAILURE,
            )
        result = purge_cell(bucket, cell_id, settle)
    except BucketError as err:
        raise store_failure(err, store.bucket) from err
    finally:
        bucket.close()
    if not result.finished:
        click.echo(
            f"purged the history of {cell_id} ({result.deleted} objects deleted), but live "
            f"node {result.fenced_live} owned it: the cell answers cell_purging until this "
            "command is run again once that node has let go (after its operation deadline, "
            "15 s by default)"
        )
    elif result.fenced_epoch is None and result.deleted == 0:
        click.echo(f"no cell {cell_id} in {bucket.spec}; nothing deleted")
    else:
        click.echo(f"purged {cell_id}: {result.deleted} objects deleted")
