"""The store options every command that touches a bucket shares, defined once.

``@store_options()`` adds ``--bucket``, ``--endpoint``, ``--region``, ``--access-key-id`` and
``--secret-access-key`` (each with its environment variable) and hands the command one
:class:`StoreArgs` as its ``store`` argument, so every command spells and reads them alike.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import click
from click.core import ParameterSource

from cellactors.errors import CellactorsError
from cellactors.persistence.store.bucket import Bucket

F = TypeVar("F", bound=Callable[..., Any])

BUCKET_ENV = "CELLACTORS_BUCKET"
ENDPOINT_ENV = "CELLACTORS_ENDPOINT"
REGION_ENV = "CELLACTORS_REGION"
ACCESS_KEY_ENV = "CELLACTORS_S3_ACCESS_KEY_ID"
SECRET_KEY_ENV = "CELLACTORS_S3_SECRET_ACCESS_KEY"
SECRET_KEY_FILE_ENV = "CELLACTORS_S3_SECRET_ACCESS_KEY_FILE"
#: The peer keyring (``serve --peer-key-file``), read by every command that signs.
PEER_KEY_FILE_ENV = "CELLACTORS_PEER_KEY_FILE"
BUCKET_HELP = "s3://BUCKET[/PREFIX] or gs://BUCKET[/PREFIX]"


@dataclass(frozen=True)
class StoreArgs:
    """The store options as given (flags or environment)."""

    bucket: str | None = None
    endpoint: str | None = None
    region: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = None
    #: The secret key came as a flag: every user of the machine sees it in the process list.
    secret_in_argv: bool = False

    def options(self, timeout: float = 10.0) -> Any:
        """The persistence layer's :class:`~cellactors.persistence.store.factory.StoreOptions`."""
        from cellactors.persistence.store.factory import StoreOptions

        return StoreOptions(
            endpoint=self.endpoint,
            region=self.region,
            access_key=self.access_key_id,
            secret_key=self.secret_access_key,
            timeout=timeout,
        )

    def open(self) -> Bucket:
        """Open the bucket; a :class:`~cellactors.cli.failures.CommandFailed` with the exit
        code of the failure (bad spec 2, credentials 4, unreachable 5)."""
        from cellactors.cli.failures import CommandFailed, store_failure
        from cellactors.persistence.store.factory import open_bucket

        if not self.bucket:
            raise CommandFailed("--bucket is required")
        if self.secret_in_argv:  # a log record: one JSON line under --log-format json
            logging.getLogger("cellactors.cli").warning(
                "--secret-access-key on the command line is visible to every user of this "
                "machine (ps, /proc); use --secret-access-key-file, %s, or the AWS credential "
                "chain instead",
                SECRET_KEY_ENV,
            )
        try:
            return open_bucket(self.bucket, self.options())
        except CellactorsError as err:
            raise store_failure(err, self.bucket) from err
        except Exception as err:  # e.g. a missing dialect dependency
            raise CommandFailed(f"cannot open {self.bucket}: {type(err).__name__}: {err}") from err


def store_options(*, required: bool = True, bucket_help: str = BUCKET_HELP) -> Callable[[F], F]:
    """Add the shared store options; the command receives them as ``store: StoreArgs``."""

    def decorate(command: F) -> F:
        @functools.wraps(command)
        def wrapper(
            *args: Any,
            bucket: str | None,
            endpoint: str | None,
            region: str | None,
            access_key_id: str | None,
            secret_access_key: str | None,
            secret_access_key_file: Path | None,
            **kwargs: Any,
        ) -> Any:
            source = click.get_current_context().get_parameter_source("secret_access_key")
            if secret_access_key_file is not None:
                if secret_access_key is not None:
                    raise click.UsageError(
                        "give the secret key once: --secret-access-key or --secret-access-key-file"
                    )
                secret_access_key = _read_secret(secret_access_key_file)
            store = StoreArgs(
                bucket,
                endpoint,
                region,
                access_key_id,
                secret_access_key,
                secret_in_argv=source is ParameterSource.COMMANDLINE,
            )
            return command(*args, store=store, **kwargs)

        options = [
            click.option(
                "--bucket",
                "bucket",
                required=required,
                metavar="SPEC",
                envvar=BUCKET_ENV,
                show_envvar=True,
                help=bucket_help,
            ),
            click.option(
                "--endpoint",
                default=None,
                metavar="URL",
                envvar=ENDPOINT_ENV,
                show_envvar=True,
                help="S3 endpoint (s3:// only) [AWS, or AWS_ENDPOINT_URL_S3].",
            ),
            click.option(
                "--region",
                default=None,
                envvar=REGION_ENV,
                show_envvar=True,
                help="S3 region (ignored for gs://).",
            ),
            click.option(
                "--access-key-id",
                default=None,
                metavar="KEY",
                envvar=ACCESS_KEY_ENV,
                show_envvar=True,
                help="S3 static access key id (s3:// only) [the AWS credential chain].",
            ),
            click.option(
                "--secret-access-key",
                default=None,
                metavar="SECRET",
                envvar=SECRET_KEY_ENV,
                show_envvar=True,
                help="S3 static secret key (s3:// only); prefer the environment variable or "
                "--secret-access-key-file: a flag is visible in the process list.",
            ),
            click.option(
                "--secret-access-key-file",
                default=None,
                metavar="PATH",
                type=click.Path(dir_okay=False, path_type=Path),
                envvar=SECRET_KEY_FILE_ENV,
                show_envvar=True,
                help="A file holding the S3 static secret key (s3:// only), e.g. a mounted "
                "Secret: the key never appears in the process list or the environment.",
            ),
        ]
        decorated: Any = wrapper
        for option in reversed(options):
            decorated = option(decorated)
        result: F = decorated
        return result

    return decorate


def _read_secret(path: Path) -> str:
    """The secret a file holds (one line; a trailing newline is not part of it)."""
    try:
        secret = path.read_text(encoding="utf-8").rstrip("\r\n")
    except (OSError, UnicodeDecodeError) as err:
        raise click.UsageError(f"--secret-access-key-file {path}: cannot read it: {err}") from err
    if not secret:
        raise click.UsageError(f"--secret-access-key-file {path}: the file is empty")
    return secret
