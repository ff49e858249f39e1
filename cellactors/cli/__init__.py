"""The ``cellactors`` command: a click group; each subcommand lives in its own module."""

from __future__ import annotations

import click


@click.group()
@click.version_option(package_name="cellactors")
def main() -> None:
    """Durable single-instance actors fenced and replicated through an object store."""


def _register() -> None:
    from cellactors.cli import qualify as _qualify
    from cellactors.cli import restore as _restore
    from cellactors.cli import serve as _serve

    main.add_command(_qualify.qualify)
    main.add_command(_serve.serve)
    main.add_command(_restore.restore)


_register()
