"""``cellactors dead-letters``: list, retry or purge a cell's dead letters (the outbox
messages its node gave up), through a node's internal listener.

The requests are signed with the fleet key (:mod:`cellactors.cli.operator`). ``list``
prints one JSON object per dead letter and line; ``retry`` and ``purge`` print the ids they
moved or deleted, one per line.
"""

from __future__ import annotations

import json
from typing import Any

import click

from cellactors.cli.operator import Operator, node_option
from cellactors.cli.store_options import StoreArgs, store_options


def _selection(f: Any) -> Any:
    f = click.option(
        "--id", "ids", multiple=True, metavar="ID", help="A dead letter's id (repeatable)."
    )(f)
    return click.option("--all", "every", is_flag=True, help="Every dead letter of the cell.")(f)


@click.group("dead-letters")
def dead_letters() -> None:
    """List, retry or purge a cell's dead letters through a node's internal listener."""


@dead_letters.command("list")
@store_options()
@node_option
def list_letters(store: StoreArgs, node_url: str, cell_id: str, timeout: float) -> None:
    """Print the cell's dead letters as JSON lines, oldest first."""
    answer = Operator(store, timeout).send(node_url, cell_id, "GET", "/dead-letters")
    for letter in answer.get("dead_letters", []):
        click.echo(json.dumps(letter, separators=(",", ":"), sort_keys=True))


@dead_letters.command("retry")
@store_options()
@node_option
@_selection
def retry(
    store: StoreArgs,
    node_url: str,
    cell_id: str,
    timeout: float,
    ids: tuple[str, ...],
    every: bool,
) -> None:
    """Move dead letters back into the cell's outbox, to be delivered again under the same
    message ids (idempotency keys); print the ids moved."""
    _each(store, timeout, node_url, cell_id, "POST", ids, every, "retried")


@dead_letters.command("purge")
@store_options()
@node_option
@_selection
def purge(
    store: StoreArgs,
    node_url: str,
    cell_id: str,
    timeout: float,
    ids: tuple[str, ...],
    every: bool,
) -> None:
    """Delete dead letters for good; print the ids deleted."""
    _each(store, timeout, node_url, cell_id, "DELETE", ids, every, "purged")


def _each(
    store: StoreArgs,
    timeout: float,
    node_url: str,
    cell_id: str,
    method: str,
    ids: tuple[str, ...],
    every: bool,
    done: str,
) -> None:
    """Retry or purge ``--all`` (one request) or each ``--id`` (one request each)."""
    if every == bool(ids):
        raise click.UsageError("give --all or one or more --id")
    operator = Operator(store, timeout)
    retrying = method == "POST"
    suffixes = ["/retry" if retrying else ""] if every else []
    for letter in ids:
        suffixes.append(f"/{letter}/retry" if retrying else f"/{letter}")
    for suffix in suffixes:
        answer = operator.send(node_url, cell_id, method, "/dead-letters" + suffix)
        for letter_id in answer.get(done, []):
            click.echo(letter_id)
