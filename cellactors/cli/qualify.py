"""``cellactors qualify``: check that a bucket fences the way the fleet protocol needs.

Runs the sequential contract (both dialects) and, for ``s3://`` buckets, the concurrency
hammer; exits 0 when the store qualifies, 1 when it broke the contract, 2 when the run
could not complete. The logic lives in :mod:`cellactors.persistence.qualify`.
"""

from __future__ import annotations

import sys

import click

from cellactors.errors import ConfigError
from cellactors.persistence.bucket import Bucket
from cellactors.persistence.factory import StoreOptions, open_bucket
from cellactors.persistence.qualify import (
    EXIT_INCOMPLETE,
    HammerReport,
    RoundResult,
    new_run_id,
    probe_root,
    run_contract,
    run_hammer,
    verdict,
)
from cellactors.persistence.spec import parse_bucket_spec


def _open(
    spec: str,
    endpoint: str | None,
    region: str | None,
    access_key_id: str | None,
    secret_access_key: str | None,
) -> tuple[Bucket, bool]:
    """Open the bucket; return it and whether it speaks the GCS dialect."""
    parsed = parse_bucket_spec(spec)
    options = StoreOptions(
        endpoint=endpoint,
        region=region,
        access_key=access_key_id,
        secret_key=secret_access_key,
    )
    return open_bucket(parsed, options), parsed.is_gcs


@click.command("qualify")
@click.option(
    "--bucket",
    "bucket_spec",
    required=True,
    metavar="SPEC",
    help="s3://BUCKET[/PREFIX] or gs://BUCKET[/PREFIX]",
)
@click.option("--endpoint", default=None, metavar="URL", help="S3 endpoint (s3:// only).")
@click.option("--region", default=None, help="S3 region (ignored for gs://).")
@click.option(
    "--access-key-id",
    default=None,
    envvar="CELLACTORS_S3_ACCESS_KEY_ID",
    help="S3 static access key id (s3:// only).",
)
@click.option(
    "--secret-access-key",
    default=None,
    envvar="CELLACTORS_S3_SECRET_ACCESS_KEY",
    help="S3 static secret key (s3:// only).",
)
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
def qualify(
    bucket_spec: str,
    endpoint: str | None,
    region: str | None,
    access_key_id: str | None,
    secret_access_key: str | None,
    writers: int,
    rounds: int,
) -> None:
    """Qualify a store: exit 0 qualified, 1 contract broken, 2 run could not complete.

    Runs the sequential conditional-write contract, then (s3:// only) a concurrency hammer
    in which WRITERS threads race one conditional PUT per round; every round must have
    exactly one winner. Probe objects live under probe/<run id>/ and are deleted afterwards.
    """
    try:
        bucket, is_gcs = _open(bucket_spec, endpoint, region, access_key_id, secret_access_key)
    except ConfigError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_INCOMPLETE)
    except Exception as exc:  # e.g. a missing dialect dependency or unusable credentials
        click.echo(f"error: cannot open {bucket_spec}: {type(exc).__name__}: {exc}", err=True)
        sys.exit(EXIT_INCOMPLETE)

    run_id = new_run_id()
    click.echo(f"qualifying {bucket.spec} (probe keys under {probe_root(run_id)})")
    try:
        contract = run_contract(bucket, run_id)
        click.echo(f"sequential contract: {contract.summary()}")
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

    result = verdict(contract, hammer)
    for line in result.details:
        click.echo(f"  {line}")
    click.echo(result.line)
    sys.exit(result.code)


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
