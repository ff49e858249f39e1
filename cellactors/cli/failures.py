"""Exit codes shared by every ``cellactors`` command, and the one ``error:`` line each
failure ends with (the table is in docs/cli.md).

Store failures are told apart here, from the typed errors of the persistence layer: missing
or refused credentials (4), a store that cannot be reached (5), and anything else the store
or the configuration got wrong (2). Only a store that breaks the conditional-write contract
is reported as unable to fence a fleet.
"""

from __future__ import annotations

from cellactors.errors import (
    BucketError,
    CellactorsError,
    ConfigError,
    StoreCredentialsError,
    StoreUnreachable,
)

EXIT_OK = 0
EXIT_FAILURE = 1  # unexpected failure; qualify: disqualified; restore: no such cell
EXIT_CONFIG = 2  # bad flags, app, bucket spec; an unusable store; qualify: incomplete run
EXIT_FENCED = 3  # serve: self-fenced (the runner's RunEnd.FENCED)
EXIT_CREDENTIALS = 4  # no store credentials, or the store refused them
EXIT_UNREACHABLE = 5  # the store's endpoint cannot be reached
EXIT_ADDRESS_IN_USE = 6  # serve/dev: a listen address cannot be bound
EXIT_INTERRUPTED = 130  # Ctrl-C while a command other than serve or dev was running

CREDENTIALS_HINT = (
    "give --access-key-id/--secret-access-key (CELLACTORS_S3_ACCESS_KEY_ID/"
    "CELLACTORS_S3_SECRET_ACCESS_KEY) or configure the AWS credential chain for s3://; "
    "gs:// uses Application Default Credentials"
)


class CommandFailed(Exception):
    """A command gives up: ``error: <message>`` on stderr and exit ``code``."""

    def __init__(self, message: str, code: int = EXIT_CONFIG) -> None:
        super().__init__(message)
        self.code = code


def store_failure(err: CellactorsError, spec: str | None) -> CommandFailed:
    """The message and exit code for a failure while opening or using a store."""
    where = spec or "the store"
    if isinstance(err, StoreCredentialsError):
        return CommandFailed(
            f"no usable credentials for {where}: {err}; {CREDENTIALS_HINT}", EXIT_CREDENTIALS
        )
    if isinstance(err, StoreUnreachable):
        return CommandFailed(
            f"cannot reach the store for {where}: {err}; check --endpoint and the network",
            EXIT_UNREACHABLE,
        )
    if isinstance(err, ConfigError):
        return CommandFailed(str(err), EXIT_CONFIG)
    if isinstance(err, BucketError):
        return CommandFailed(f"the store for {where} failed: {err}", EXIT_CONFIG)
    return CommandFailed(str(err), EXIT_CONFIG)
