"""``cellactors feed``: print a cell's change feed from the bucket as JSON lines.

Reads the bucket alone (no node needed) and writes nothing. Each line is one acknowledged
transaction in txid order (docs/feed.md); ``--follow`` keeps polling and prints new ones as
they are acknowledged until interrupted.
"""

from __future__ import annotations

import json
import sys

import click

from cellactors.cli.failures import EXIT_FAILURE, CommandFailed, store_failure
from cellactors.cli.store_options import StoreArgs, store_options
from cellactors.core import keys
from cellactors.errors import BucketError, CellactorsError, HistoryCollected
from cellactors.persistence.control.ownership import OwnershipStore
from cellactors.wire import codec


@click.command("feed")
@store_options()
@click.option("--cell", "cell_id", required=True, metavar="CLASS:NAME", help="e.g. Counter:a")
@click.option(
    "--after",
    default=0,
    show_default=True,
    type=click.IntRange(min=0),
    metavar="TXID",
    help="Print the transactions after this txid.",
)
@click.option("--follow", is_flag=True, help="Keep printing new transactions as they come.")
@click.option(
    "--poll-interval",
    default=0.25,
    show_default=True,
    type=click.FloatRange(min=0.05),
    metavar="SECONDS",
    help="With --follow: how often the bucket is read while nothing new appears.",
)
def feed(store: StoreArgs, cell_id: str, after: int, follow: bool, poll_interval: float) -> None:
    """Print the cell's acknowledged transactions after --after as JSON lines; exit 1 when
    the bucket has no such cell."""
    from cellactors.errors import FeedHole
    from cellactors.persistence.history.feed import changes

    try:
        keys.validate_cell_id(cell_id)
    except CellactorsError as err:
        raise CommandFailed(str(err)) from err
    bucket = store.open()
    try:
        if OwnershipStore(bucket, "feed").read_owner(cell_id) is None:
            raise CommandFailed(f"no cell {cell_id} in {bucket.spec}", EXIT_FAILURE)
        for change in changes(bucket, cell_id, after, follow=follow, poll_interval=poll_interval):
            line = json.dumps(change.to_wire(), default=_json_default, separators=(",", ":"))
            click.echo(line)
            sys.stdout.flush()
    except HistoryCollected as err:
        raise CommandFailed(str(err), EXIT_FAILURE) from err
    except FeedHole as err:
        raise CommandFailed(str(err), EXIT_FAILURE) from err
    except BucketError as err:
        raise store_failure(err, store.bucket) from err
    finally:
        bucket.close()


def _json_default(value: object) -> object:
    """Bytes (BLOB columns) as ``{"$bytes": "<base64>"}``, as the HTTP API sends them."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return json.loads(codec.encode(bytes(value), "json"))
    raise TypeError(f"{type(value).__name__} is not JSON serializable")
