"""``cellactors clone``: make a new cell whose database starts as another cell's, now or
at a txid (:mod:`cellactors.persistence.history.clone`)."""

from __future__ import annotations

import click

from cellactors.cli.failures import EXIT_FAILURE, CommandFailed, store_failure
from cellactors.cli.store_options import StoreArgs, store_options
from cellactors.errors import BucketError, CellactorsError, HistoryCollected, PointNotRestorable
from cellactors.persistence.history.clone import clone_cell


@click.command("clone")
@store_options()
@click.option("--cell", "source", required=True, metavar="CLASS:NAME", help="The source cell.")
@click.option("--to", "target", required=True, metavar="CLASS:NAME", help="The new cell.")
@click.option(
    "--at-txid",
    type=click.IntRange(min=1),
    default=None,
    metavar="TXID",
    help="Start from the source as it was right after this transaction (default: now).",
)
def clone(store: StoreArgs, source: str, target: str, at_txid: int | None) -> None:
    """Create the cell --to with the database of --cell (as acknowledged now, or right after
    --at-txid). Fails if --to exists; writes nothing under --cell."""
    bucket = store.open()
    try:
        result = clone_cell(bucket, source, target, at_txid)
    except (HistoryCollected, PointNotRestorable) as err:
        raise CommandFailed(str(err), EXIT_FAILURE) from err
    except BucketError as err:
        raise store_failure(err, store.bucket) from err
    except CellactorsError as err:
        raise CommandFailed(str(err), EXIT_FAILURE) from err
    finally:
        bucket.close()
    click.echo(f"cloned {source} at txid {result.txid} to {target}")
