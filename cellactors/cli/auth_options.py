"""The options that say who may call a node's public listener (docs/security.md), defined
once: ``@auth_options()`` adds them and hands the command one :class:`AuthArgs`."""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from cellactors.errors import ConfigError

if TYPE_CHECKING:  # the server loads only when a node is served, not for every command
    from cellactors.server.auth.authentication import Authentication
    from cellactors.server.peer_keys import KeySource

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class AuthArgs:
    """The authentication options as given (flags or environment)."""

    api_keys: Path | None = None
    jwt_key: Path | None = None
    jwt_issuer: str | None = None
    jwt_audience: str | None = None
    jwt_roles_claim: str = "roles"
    authenticate: str | None = None
    allow_anonymous: bool = False
    cors_origins: tuple[str, ...] = ()

    def authentication(self) -> Authentication:
        """The node's :class:`~cellactors.server.auth.Authentication` (ConfigError when a
        file or hook is unusable)."""
        from cellactors.server.auth import ApiKeys, Authentication, JwtBearer, Scheme
        from cellactors.server.auth.authentication import HookScheme

        schemes: list[Scheme] = []
        if self.api_keys is not None:
            schemes.append(ApiKeys(self.api_keys))
        if self.jwt_key is not None:
            schemes.append(
                JwtBearer(
                    self.jwt_key,
                    issuer=self.jwt_issuer,
                    audience=self.jwt_audience,
                    roles_claim=self.jwt_roles_claim,
                )
            )
        elif self.jwt_issuer or self.jwt_audience:
            raise ConfigError("--jwt-issuer and --jwt-audience need --jwt-key")
        if self.authenticate:
            schemes.append(HookScheme(load_hook(self.authenticate), self.authenticate))
        return Authentication(schemes)

    def check_cors(self) -> None:
        from cellactors.server.cors import check_origin

        for origin in self.cors_origins:
            try:
                check_origin(origin)
            except ValueError as e:
                raise ConfigError(f"--cors-origin: {e}") from None


@dataclass(frozen=True)
class Access:
    """Who may reach what, as ``serve`` hands it to the listeners."""

    authentication: Authentication
    allow_anonymous: bool = False
    cors_origins: tuple[str, ...] = ()
    internal_hosts: tuple[str, ...] = ()
    #: The peer keyring (``--peer-key-file``); None: the fleet key in the bucket.
    peer_keys: KeySource | None = None


def load_hook(spec: str) -> Callable[..., Any]:
    """The callable ``pkg.mod:function`` names."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"--authenticate {spec!r}: expected pkg.module:function")
    try:
        hook = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"--authenticate {spec}: {e}") from None
    if not callable(hook):
        raise ConfigError(f"--authenticate {spec} is not callable")
    return hook  # type: ignore[no-any-return]


def auth_options() -> Callable[[F], F]:
    """Add the authentication options; the command receives ``auth: AuthArgs``."""

    def decorate(command: F) -> F:
        @functools.wraps(command)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            kwargs["auth"] = AuthArgs(
                api_keys=kwargs.pop("api_keys"),
                jwt_key=kwargs.pop("jwt_key"),
                jwt_issuer=kwargs.pop("jwt_issuer"),
                jwt_audience=kwargs.pop("jwt_audience"),
                jwt_roles_claim=kwargs.pop("jwt_roles_claim"),
                authenticate=kwargs.pop("authenticate"),
                allow_anonymous=kwargs.pop("allow_anonymous"),
                cors_origins=tuple(kwargs.pop("cors_origins")),
            )
            return command(*args, **kwargs)

        options = [
            click.option(
                "--api-keys",
                envvar="CELLACTORS_API_KEYS",
                show_envvar=True,
                type=click.Path(dir_okay=False, path_type=Path),
                metavar="FILE",
                help='API keys: JSON {"<key>": {"principal": "...", "roles": [...]}}, sent as '
                "Authorization: Bearer <key>; read again when it changes.",
            ),
            click.option(
                "--jwt-key",
                envvar="CELLACTORS_JWT_KEY",
                show_envvar=True,
                type=click.Path(dir_okay=False, path_type=Path),
                metavar="FILE",
                help="Accept JWT bearer tokens signed by this PEM public key or JWKS file "
                "(read again when it changes).",
            ),
            click.option("--jwt-issuer", envvar="CELLACTORS_JWT_ISSUER", metavar="ISS"),
            click.option("--jwt-audience", envvar="CELLACTORS_JWT_AUDIENCE", metavar="AUD"),
            click.option(
                "--jwt-roles-claim",
                envvar="CELLACTORS_JWT_ROLES_CLAIM",
                default="roles",
                show_default=True,
                metavar="CLAIM",
                help="The token claim holding the caller's roles.",
            ),
            click.option(
                "--authenticate",
                envvar="CELLACTORS_AUTHENTICATE",
                metavar="MODULE:FUNCTION",
                help="The app's own scheme: FUNCTION(headers) -> cellactors.Principal | None.",
            ),
            click.option(
                "--allow-anonymous",
                envvar="CELLACTORS_ALLOW_ANONYMOUS",
                is_flag=True,
                help="Serve a public listener that is not loopback with no authentication "
                "scheme, on purpose (a gateway in front authenticates).",
            ),
            click.option(
                "--cors-origin",
                "cors_origins",
                envvar="CELLACTORS_CORS_ORIGINS",
                multiple=True,
                metavar="ORIGIN",
                help="An origin (https://app.example.com) whose pages may call the public "
                "listener from a browser (repeatable); none: cross-origin calls are refused.",
            ),
        ]
        for option in reversed(options):
            wrapped = option(wrapped)
        return wrapped  # type: ignore[return-value]

    return decorate
