"""The schemes of one node, asked in turn: the first that recognises a request's
credential names its principal; a credential none of them accepts is refused.

A scheme's :meth:`Scheme.authenticate` gets the request's headers and answers a
:class:`~cellactors.core.principal.Principal`, None when the credential is not one of its
kind (the next scheme is asked), or raises :class:`~cellactors.errors.Unauthenticated` when
it is of its kind and wrong (expired, badly signed, revoked). A request with no
``Authorization`` header is anonymous. Schemes run on the serving event loop: they must
not block (the built-in ones read no file per request and make no network call).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from cellactors.core.principal import Principal
from cellactors.errors import ConfigError, Unauthenticated
from cellactors.wire.addresses import is_loopback


class Scheme(Protocol):
    """One way of authenticating a caller."""

    name: str

    def authenticate(self, headers: Mapping[str, str]) -> Principal | None: ...


def bearer_token(headers: Mapping[str, str]) -> str | None:
    """The token of ``Authorization: Bearer <token>``; None without the header;
    :class:`Unauthenticated` for another form."""
    value = headers.get("authorization")
    if value is None:
        return None
    kind, _, token = value.strip().partition(" ")
    token = token.strip()
    if kind.lower() != "bearer" or not token:
        raise Unauthenticated("the Authorization header must be 'Bearer <key or token>'")
    return token


class HookScheme:
    """An app's own ``authenticate(headers) -> Principal | None`` as a scheme: None is "not
    my kind of credential"; it raises :class:`Unauthenticated` to refuse one."""

    def __init__(self, hook: Callable[[Mapping[str, str]], Principal | None], name: str) -> None:
        self.hook = hook
        self.name = name

    def authenticate(self, headers: Mapping[str, str]) -> Principal | None:
        principal = self.hook(headers)
        if principal is not None and not isinstance(principal, Principal):
            raise TypeError(f"{self.name} returned {type(principal).__name__}, not a Principal")
        return principal


class Authentication:
    """The node's schemes (none: the node is *open*, every caller anonymous and admitted,
    as a node on loopback for development is)."""

    def __init__(self, schemes: Sequence[Scheme] = ()) -> None:
        self.schemes = tuple(schemes)

    @property
    def open(self) -> bool:
        """No scheme configured: nobody is authenticated and everyone is admitted."""
        return not self.schemes

    def describe(self) -> str:
        return ", ".join(s.name for s in self.schemes) or "none (open)"

    def authenticate(self, headers: Mapping[str, str]) -> Principal | None:
        """The caller's principal; None for an anonymous request or on an open node;
        :class:`Unauthenticated` for an ``Authorization`` no scheme accepts. Every scheme
        is asked, with or without that header: an app's own may read others."""
        if self.open:
            return None
        for scheme in self.schemes:
            principal = scheme.authenticate(headers)
            if principal is not None:
                return principal
        if "authorization" in headers:
            raise Unauthenticated("the credential is not valid (unknown key or token)")
        return None


def check_exposure(auth: Authentication, public_host: str, allow_anonymous: bool) -> None:
    """Refuse an open public listener (no scheme) on an address other than loopback,
    unless ``allow_anonymous`` says it is on purpose (a gateway in front authenticates)."""
    if auth.open and not allow_anonymous and not is_loopback(public_host):
        raise ConfigError(
            f"the public listener on {public_host} would admit anyone who reaches it: give an "
            "authentication scheme (--api-keys, --jwt-key, --authenticate) or say "
            "--allow-anonymous on purpose (docs/security.md)"
        )
