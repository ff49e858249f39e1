"""``cellactors qualify``: check that a bucket fences the way the fleet protocol needs.

Runs the sequential contract and the list-after-write check (both dialects) and, for
``s3://`` buckets, the concurrency hammer; exits 0 when the store qualifies, 1 when it
broke the contract or its listings lag, 2 when the run could not complete, 4 or 5 when the
store could not be asked at all (no usable credentials, unreachable endpoint). The logic
lives in :mod:`cellactors.persistence.store.qualify`.
"""

from __future__ import annotations

import sys

import click

from cellactors.cli.failures import EXIT_CONFIG, CommandFailed, store_failure
from cellactors.cli.qualify_verdict import verdict
from cellactors.cli.store_options import StoreArgs, store_options
from cellactors.errors import CellactorsError, StoreCredentialsError, StoreUnreachable
from cellactors.persistence.store.bucket import Bucket
from cellactors.persistence.store.qualify import (
    HammerReport,
    ListingReport,
    RoundResult,
    new_run_id,
    probe_root,
    run_contract,
    run_hammer,
    run_listing,
)


@click.command("qualify")
@store_options()
@click.option(
    "--writers",
    default=8,
    show_default=True,
    type=click.IntRange(min=2),
    help="Concurrent writers racing in each hammer round.",
)
@click.option(
    "--rounds",
    default=32,
    show_default=True,
    type=click.IntRange(min=1),
    help="Rounds in each hammer phase (create, update).",
)
def qualify(store: StoreArgs, writers: int, rounds: int) -> None:
    """Qualify a store: exit 0 qualified, 1 contract broken, 2 run could not complete,
    4 no usable credentials, 5 store unreachable.

    Runs the sequential conditional-write contract, then a list-after-write and
    list-after-delete check (every object in the very next listing after its PUT, across
    pages; gone from the next one after its DELETE), then (s3:// only) a concurrency hammer
    in which WRITERS threads race one conditional PUT per round; every round must have
    exactly one winner. Probe objects live under probe/<run id>/ and are deleted afterwards.
    A bucket that does not exist fails first (exit 2): some stores would create it.
    """
    bucket = store.open()
    is_gcs = bucket.spec.startswith("gs://")
    run_id = new_run_id()
    try:
        _require_bucket(bucket, store.bucket)
    except BaseException:
        bucket.close()
        raise
    click.echo(f"qualifying {bucket.spec} (probe keys under {probe_root(run_id)})")
    try:
        contract = run_contract(bucket, run_id)
        if isinstance(contract.cause, StoreCredentialsError | StoreUnreachable):
            # Not the store's answer to the contract: it could not be asked at all.
            raise store_failure(contract.cause, store.bucket)
        click.echo(f"sequential contract: {contract.summary()}")
        listing: ListingReport | None = None
        if contract.completed:
            listing = run_listing(bucket, run_id)
            click.echo(f"list-after-write: {listing.summary()}")
        hammer: HammerReport | None = None
        if is_gcs:
            click.echo(
                "concurrency hammer: not run; it speaks the S3 dialect, so this gs:// bucket "
                "gets the sequential contract only"
            )
        elif not contract.completed:
            click.echo("concurrency hammer: not run; the contract could not complete")
        else:
            hammer = _hammer_with_progress(bucket, writers, rounds, run_id)
    finally:
        bucket.close()

    result = verdict(contract, hammer, listing)
    for line in result.details:
        click.echo(f"  {line}")
    click.echo(result.line)
    sys.exit(result.code)


def _require_bucket(bucket: Bucket, spec: str | None) -> None:
    """Fail (exit 2) unless the bucket exists: SeaweedFS creates a bucket on its first PUT,
    so a mistyped name would otherwise be qualified, and then used, as a fresh bucket."""
    try:
        found = bucket.exists()
    except CellactorsError as err:
        raise store_failure(err, spec) from err
    if not found:
        raise CommandFailed(
            f"bucket {bucket.spec} does not exist; create it first (or check its name)",
            EXIT_CONFIG,
        )


def _hammer_with_progress(bucket: Bucket, writers: int, rounds: int, run_id: str) -> HammerReport:
    """Run the hammer with a progress bar on stderr."""
    with click.progressbar(
        length=2 * rounds,
        label=f"hammer: {writers} writers x {rounds} rounds x 2 phases",
        file=sys.stderr,
    ) as bar:

        def advance(_: RoundResult) -> None:
            bar.update(1)

        return run_hammer(bucket, writers, rounds, progress=advance, run_id=run_id)
