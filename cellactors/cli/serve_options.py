"""The parsing pieces ``cellactors serve`` shares with its option groups: options named by
their environment variable ``CELLACTORS_<FLAG>``, durations, and the limits on the wire."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])

ENV_PREFIX = "CELLACTORS_"

#: The ``ServerSettings`` fields the wire options set, by option parameter name.
WIRE_FIELDS = (
    "max_body_bytes",
    "max_header_bytes",
    "max_header_count",
    "header_timeout",
    "body_timeout",
    "keep_alive_timeout",
    "max_connections",
    "max_feed_streams",
)


def envvar(name: str) -> str:
    return ENV_PREFIX + name.upper().replace("-", "_")


class Duration(click.ParamType):  # type: ignore[type-arg]
    """A duration in seconds, written as a number with an optional unit: s, m, h or d."""

    name = "duration"
    _UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        if isinstance(value, (int, float)):
            return float(value)
        m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([smhd]?)\s*", str(value))
        if not m:
            self.fail(f"{value!r} is not a duration (e.g. 7d, 12h, 30m, 90s, 0)", param, ctx)
        return float(m.group(1)) * self._UNITS[m.group(2)]


DURATION = Duration()


class AppSpec(click.ParamType):  # type: ignore[type-arg]
    """One ``--app`` value: a module, file or package, or a comma list of them. The option
    is repeatable; its environment variable is a comma list (paths may hold spaces)."""

    name = "module"
    envvar_list_splitter = ","

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        return str(value)


APP_SPEC = AppSpec()
APP_HELP = (
    "The app: pkg.mod, path/to/app.py, or a package (pkg, or a directory with __init__.py; "
    "every submodule is imported). Repeat it, or give a comma list, for several."
)


def app_option(**kwargs: Any) -> Callable[[F], F]:
    """The repeatable ``--app`` option; the command receives one comma list as ``app``."""

    def decorate(command: F) -> F:
        @functools.wraps(command)
        def wrapped(*args: Any, app: tuple[str, ...], **rest: Any) -> Any:
            return command(*args, app=",".join(app), **rest)

        option = click.option(
            "--app", "app", required=True, multiple=True, type=APP_SPEC, help=APP_HELP, **kwargs
        )
        return option(wrapped)  # type: ignore[return-value]

    return decorate


def env_option(flag: str, *names: str, **kwargs: Any) -> Callable[[F], F]:
    """A click option whose environment variable is ``CELLACTORS_<FLAG>``."""
    kwargs.setdefault("envvar", envvar(flag.lstrip("-")))
    kwargs.setdefault("show_envvar", True)
    return click.option(flag, *names, **kwargs)


def wire_options() -> Callable[[F], F]:
    """Add the limits on the wire (docs/http-api.md); the command receives them as
    ``wire``, a dict of :class:`~cellactors.server.app.ServerSettings` fields."""

    def decorate(command: F) -> F:
        @functools.wraps(command)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            kwargs["wire"] = {name: kwargs.pop(name) for name in WIRE_FIELDS}
            return command(*args, **kwargs)

        options = [
            env_option(
                "--max-body-bytes",
                default=1 << 20,
                show_default=True,
                type=click.IntRange(min=1),
                metavar="BYTES",
                help="Largest accepted request body.",
            ),
            env_option(
                "--max-header-bytes",
                default=32 << 10,
                show_default=True,
                type=click.IntRange(min=1024),
                metavar="BYTES",
                help="Largest request head (request line and headers), on both listeners: "
                "over it the request is answered 431 and the connection closed.",
            ),
            env_option(
                "--max-headers",
                "max_header_count",
                default=100,
                show_default=True,
                type=click.IntRange(min=8),
                metavar="N",
                help="Most headers a request may have, on both listeners: over it 431 and closed.",
            ),
            env_option(
                "--header-timeout",
                default=10.0,
                show_default=True,
                type=click.FloatRange(min=0.1),
                metavar="SECONDS",
                help="A request head must arrive whole this long after its first byte: else "
                "408 and the connection is closed.",
            ),
            env_option(
                "--body-timeout",
                default=60.0,
                show_default=True,
                type=click.FloatRange(min=0.1),
                metavar="SECONDS",
                help="A request body must arrive whole this long after its head: else it is "
                "cut off (408 if nothing was answered yet) and the connection closed.",
            ),
            env_option(
                "--keep-alive-timeout",
                default=75.0,
                show_default=True,
                type=click.FloatRange(min=0.1),
                metavar="SECONDS",
                help="A connection idle this long (new, or between requests) is closed; keep "
                "it above the idle timeout of a load balancer or proxy in front (60 s for "
                "most), so that it closes first (rounded up to whole seconds between "
                "requests).",
            ),
            env_option(
                "--max-connections",
                default=1024,
                show_default=True,
                type=click.IntRange(min=1),
                metavar="N",
                help="Open connections per listener; one more is answered 503 (node_unavailable, "
                "retryable) and closed at once.",
            ),
            env_option(
                "--max-feed-streams",
                default=1000,
                show_default=True,
                type=click.IntRange(min=1),
                metavar="STREAMS",
                help="Most change feed follow streams (wait > 0) open at once on this node; "
                "one more is answered 503 feed_unavailable (retryable: the client tries "
                "another node).",
            ),
        ]
        for option in reversed(options):
            wrapped = option(wrapped)
        return wrapped  # type: ignore[return-value]

    return decorate
