"""``cellactors rollback``: roll a live cell back in place to a txid or a time, through the
node that owns it (signed like ``cellactors dead-letters``: :mod:`cellactors.cli.operator`).

The cell's user tables become what they were then, in one new transaction that the change
feed shows as a rollback; the command prints the txid to roll back to in order to undo it.
"""

from __future__ import annotations

import json

import click

from cellactors.cli.operator import Operator, node_option
from cellactors.cli.restore import parse_time_ms
from cellactors.cli.store_options import StoreArgs, store_options


@click.command("rollback")
@store_options()
@node_option
@click.option(
    "--to-txid",
    type=click.IntRange(min=0),
    default=None,
    metavar="TXID",
    help="The state right after this transaction (0: before the first).",
)
@click.option(
    "--at-time",
    default=None,
    metavar="ISO-8601",
    help="The state after the last transaction committed at or before this time "
    "(e.g. 2025-05-01T12:00:00Z; without a zone, UTC).",
)
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def rollback(
    store: StoreArgs,
    node_url: str,
    cell_id: str,
    timeout: float,
    to_txid: int | None,
    at_time: str | None,
    yes: bool,
) -> None:
    """Roll the cell's user tables back to an earlier txid or time, in place; the calls it
    already answered stay answered, and rolling back to the txid printed undoes it."""
    if (to_txid is None) == (at_time is None):
        raise click.UsageError("give one of --to-txid and --at-time")
    point = {"to_txid": to_txid} if to_txid is not None else {"at_ms": parse_time_ms(at_time or "")}
    if not yes:
        point_text = f"txid {to_txid}" if to_txid is not None else at_time
        click.confirm(f"roll {cell_id} back to {point_text}?", abort=True)
    body = json.dumps(point).encode()
    answer = Operator(store, timeout).send(node_url, cell_id, "POST", "/rollback", body)
    [done] = answer.get("rolled_back", [{}])
    if done.get("txid") is None:
        click.echo(
            f"{cell_id} was already as it was at txid {done.get('to_txid')}: nothing written"
        )
        return
    click.echo(
        f"rolled {cell_id} back to txid {done['to_txid']} as txid {done['txid']}; to undo it: "
        f"cellactors rollback --cell {cell_id} --to-txid {done['undo_txid']}"
    )
