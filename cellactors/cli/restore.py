"""``cellactors restore``: rebuild one cell's SQLite database from the bucket into a file.

Read-only: it writes nothing to the bucket (no seal, no ownership change), so it is safe to
run against a live fleet. It includes every write acknowledged before it listed the bucket,
and may include writes of the current owner that were uploaded but not yet acknowledged.
"""

from __future__ import annotations

from pathlib import Path

import click

from cellactors.cli.failures import EXIT_FAILURE, CommandFailed, store_failure
from cellactors.cli.store_options import StoreArgs, store_options
from cellactors.errors import BucketError, CellactorsError
from cellactors.persistence import keys
from cellactors.persistence.celldb import CellDatabase
from cellactors.persistence.ownership import OwnershipStore
from cellactors.persistence.restore import restore as restore_cell


@click.command("restore")
@store_options()
@click.option("--cell", "cell_id", required=True, metavar="CLASS:NAME", help="e.g. Counter:a")
@click.option(
    "--output",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="SQLite file to write (must not exist).",
)
def restore(store: StoreArgs, cell_id: str, output: Path) -> None:
    """Write the cell's database, as the bucket holds it, to OUTPUT."""
    try:
        keys.validate_cell_id(cell_id)
    except CellactorsError as err:
        raise CommandFailed(str(err)) from err
    if output.exists():
        raise click.UsageError(f"{output} exists; choose a new file")
    bucket = store.open()
    try:
        record = OwnershipStore(bucket, "restore").read_owner(cell_id)
        if record is None:
            raise CommandFailed(f"no cell {cell_id} in {bucket.spec}", EXIT_FAILURE)
        db = CellDatabase(output)
        try:
            result = restore_cell(bucket, cell_id, record.epoch + 1, db, seal=False)
            db.conn.execute("PRAGMA journal_mode = DELETE")  # one self-contained file
        finally:
            db.close()
    except BucketError as err:
        raise store_failure(err, store.bucket) from err
    except CellactorsError as err:
        raise CommandFailed(str(err)) from err
    finally:
        bucket.close()
    owner = record.node or "(released)"
    click.echo(
        f"restored {cell_id} through txid {result.last_txid} (owner {owner}, epoch "
        f"{record.epoch}) to {output}"
    )
