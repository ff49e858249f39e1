"""``cellactors restore``: rebuild one cell's SQLite database from the bucket into a file.

Read-only: it writes nothing to the bucket (no seal, no ownership change), so it is safe to
run against a live fleet. It includes every write acknowledged before it listed the bucket,
and may include writes of the current owner that were uploaded but not yet acknowledged.
``--at-txid`` and ``--at-time`` rebuild the database as it was at an earlier point, from
the newest snapshot at or below it plus batches, within the retention period.
"""

from __future__ import annotations

import datetime
from pathlib import Path

import click

from cellactors.cli.failures import EXIT_FAILURE, CommandFailed, store_failure
from cellactors.cli.store_options import StoreArgs, store_options
from cellactors.core import keys
from cellactors.errors import BucketError, CellactorsError, HistoryCollected, PointNotRestorable
from cellactors.persistence.celldb.database import CellDatabase
from cellactors.persistence.control.ownership import OwnershipStore
from cellactors.persistence.files import create_private_file
from cellactors.persistence.history.restore import restore as restore_cell
from cellactors.persistence.history.restore import restore_at


def parse_time_ms(text: str) -> int:
    """An ISO 8601 time as milliseconds since the epoch; without a zone it is UTC."""
    try:
        stamp = datetime.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise click.BadParameter(
            f"{text!r} is not an ISO 8601 time (e.g. 2025-05-01T12:00:00Z)",
            param_hint="--at-time",
        ) from None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=datetime.timezone.utc)
    return int(stamp.timestamp() * 1000)


@click.command("restore")
@store_options()
@click.option("--cell", "cell_id", required=True, metavar="CLASS:NAME", help="e.g. Counter:a")
@click.option(
    "--output",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="SQLite file to write (must not exist).",
)
@click.option(
    "--at-txid",
    type=click.IntRange(min=1),
    default=None,
    metavar="TXID",
    help="The database exactly as it was right after this transaction.",
)
@click.option(
    "--at-time",
    default=None,
    metavar="ISO-8601",
    help="The database after the last transaction committed at or before this time "
    "(e.g. 2025-05-01T12:00:00Z; without a zone, UTC).",
)
def restore(
    store: StoreArgs, cell_id: str, output: Path, at_txid: int | None, at_time: str | None
) -> None:
    """Write the cell's database, as the bucket holds it (or as it was at a point within
    the retention period), to OUTPUT."""
    try:
        keys.validate_cell_id(cell_id)
    except CellactorsError as err:
        raise CommandFailed(str(err)) from err
    if at_txid is not None and at_time is not None:
        raise click.UsageError("give at most one of --at-txid and --at-time")
    at_ms = parse_time_ms(at_time) if at_time is not None else None
    if output.exists() or output.is_symlink():
        raise click.UsageError(f"{output} exists; choose a new file")
    if not output.parent.is_dir():
        raise click.UsageError(f"{output.parent} is not a directory; restore creates none")
    try:
        create_private_file(output, exclusive=True)  # 0600, and never through a link
    except OSError as err:
        raise click.UsageError(f"{output}: cannot create it: {err.strerror}") from err
    written = False
    try:
        bucket = store.open()
    except BaseException:
        output.unlink(missing_ok=True)
        raise
    try:
        record = OwnershipStore(bucket, "restore").read_owner(cell_id)
        if record is None:
            raise CommandFailed(f"no cell {cell_id} in {bucket.spec}", EXIT_FAILURE)
        db = CellDatabase(output)
        try:
            if at_txid is None and at_ms is None:
                # The record says how far the history surely reached: never less.
                result = restore_cell(
                    bucket, cell_id, record.epoch + 1, db, seal=False, floor=record.acked_txid
                )
            else:
                result = restore_at(
                    bucket, cell_id, record.epoch + 1, db, txid=at_txid, at_ms=at_ms
                )
            db.conn.execute("PRAGMA journal_mode = DELETE")  # one self-contained file
        except BaseException:
            db.close()
            raise
        db.close()
        written = True
    except (HistoryCollected, PointNotRestorable) as err:
        raise CommandFailed(str(err), EXIT_FAILURE) from err
    except BucketError as err:
        raise store_failure(err, store.bucket) from err
    except CellactorsError as err:
        raise CommandFailed(str(err)) from err
    finally:
        bucket.close()
        if not written:
            output.unlink(missing_ok=True)  # no empty or half-written file is left behind
    owner = record.node or "(released)"
    click.echo(
        f"restored {cell_id} through txid {result.last_txid} (owner {owner}, epoch "
        f"{record.epoch}) to {output}"
    )
