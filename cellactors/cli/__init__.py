"""The ``cellactors`` command: a click group; each subcommand lives in its own module.

Every failure ends with one ``error: ...`` line on stderr and an exit code from
:mod:`cellactors.cli.failures` (usage errors included); ``-h`` and ``--help`` both work.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Sequence
from typing import Any

import click

from cellactors.cli.failures import EXIT_FAILURE, EXIT_INTERRUPTED, CommandFailed

CONTEXT_SETTINGS: dict[str, Any] = {"help_option_names": ["-h", "--help"]}


class _Group(click.Group):
    """A group that ends every failure with a single ``error:`` line, and prints its help
    (exit 0) when called with no arguments: asking what it can do is not a usage error."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not args and not ctx.resilient_parsing:
            click.echo(ctx.get_help(), color=ctx.color)
            ctx.exit(0)
        return super().parse_args(ctx, args)

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, **extra)
        try:
            result = super().main(args, prog_name, complete_var, False, **extra)
        except CommandFailed as err:
            click.echo(f"error: {err}", err=True)
            sys.exit(err.code)
        except click.exceptions.Abort:
            click.echo("error: interrupted", err=True)
            sys.exit(EXIT_INTERRUPTED)
        except click.ClickException as err:
            ctx = getattr(err, "ctx", None)
            if ctx is not None:
                click.echo(ctx.get_usage(), err=True)
                click.echo(f"Try '{ctx.command_path} -h' for help.", err=True)
            click.echo(f"error: {err.format_message()}", err=True)
            sys.exit(err.exit_code)
        except Exception as err:
            traceback.print_exc()
            click.echo(f"error: unexpected failure: {type(err).__name__}: {err}", err=True)
            sys.exit(EXIT_FAILURE)
        sys.exit(result if isinstance(result, int) else 0)


@click.group(cls=_Group, context_settings=CONTEXT_SETTINGS)
@click.version_option(package_name="cellactors")
def main() -> None:
    """Durable single-instance actors fenced and replicated through an object store."""


def _register() -> None:
    from cellactors.cli import cells as _cells
    from cellactors.cli import clone as _clone
    from cellactors.cli import dead_letters as _dead_letters
    from cellactors.cli import dev as _dev
    from cellactors.cli import feed as _feed
    from cellactors.cli import openapi as _openapi
    from cellactors.cli import purge as _purge
    from cellactors.cli import qualify as _qualify
    from cellactors.cli import restore as _restore
    from cellactors.cli import rollback as _rollback
    from cellactors.cli import serve as _serve
    from cellactors.cli import status as _status

    main.add_command(_qualify.qualify)
    main.add_command(_serve.serve)
    main.add_command(_restore.restore)
    main.add_command(_rollback.rollback)
    main.add_command(_status.status)
    main.add_command(_cells.cells)
    main.add_command(_purge.purge)
    main.add_command(_clone.clone)
    main.add_command(_dev.dev)
    main.add_command(_feed.feed)
    main.add_command(_dead_letters.dead_letters)
    main.add_command(_openapi.openapi)


_register()
