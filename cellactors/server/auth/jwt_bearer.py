"""JWT bearer tokens (``Authorization: Bearer <jwt>``), checked with PyJWT against a public
key (PEM) or a JWKS file: signature, expiry (required), not-before, issuer and audience
when configured. The principal is the token's ``sub``; its roles come from one claim (a
list of strings, or one space-separated string).

Keys are read again when the file changes (:mod:`.watched_file`), so a key is rotated by
writing a JWKS file holding the old and the new key, then, once no token signed by the old
one is alive, the new one alone.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import jwt

from cellactors.core.principal import Principal
from cellactors.errors import ConfigError, Unauthenticated
from cellactors.server.auth.authentication import bearer_token
from cellactors.server.auth.watched_file import WatchedFile

#: Asymmetric algorithms only: a node verifies tokens, it never holds a key to sign them.
ALGORITHMS = ("RS256", "RS384", "RS512", "ES256", "ES384", "ES512", "PS256", "EdDSA")
#: Clock skew allowed on ``exp`` and ``nbf``.
LEEWAY_S = 30.0


def _looks_like_jwt(token: str) -> bool:
    return token.count(".") == 2


def load_keys(text: str, source: str) -> dict[str | None, Any]:
    """Verification keys by ``kid`` (None: a single PEM key, used for every token)."""
    stripped = text.lstrip()
    try:
        if stripped.startswith("{"):
            jwks = jwt.PyJWKSet.from_dict(json.loads(stripped))
            return {k.key_id: k.key for k in jwks.keys}
        key = jwt.algorithms.get_default_algorithms()["RS256"].prepare_key(text)
        return {None: key}
    except (ValueError, TypeError, jwt.PyJWKError, jwt.InvalidKeyError) as e:
        raise ConfigError(f"{source}: not a PEM public key or a JWKS ({e})") from None


class JwtBearer:
    """The JWT scheme (thread-safe)."""

    name = "jwt"

    def __init__(
        self,
        key_file: str | os.PathLike[str],
        *,
        issuer: str | None = None,
        audience: str | None = None,
        roles_claim: str = "roles",
        algorithms: Sequence[str] = ALGORITHMS,
    ) -> None:
        self.issuer = issuer
        self.audience = audience
        self.roles_claim = roles_claim
        self.algorithms = list(algorithms)
        self.file = WatchedFile(key_file, load_keys, "JWT key file")

    def _key_for(self, token: str) -> Any:
        try:
            kid = jwt.get_unverified_header(token).get("kid")
        except jwt.DecodeError as e:
            raise Unauthenticated(f"malformed token: {e}") from None
        keys = self.file.current()
        if None in keys:
            return keys[None]
        if kid not in keys:
            raise Unauthenticated("the token's key id is not one of the node's keys")
        return keys[kid]

    def authenticate(self, headers: Mapping[str, str]) -> Principal | None:
        token = bearer_token(headers)
        if token is None or not _looks_like_jwt(token):
            return None
        try:
            claims = jwt.decode(
                token,
                self._key_for(token),
                algorithms=self.algorithms,
                audience=self.audience,
                issuer=self.issuer,
                leeway=LEEWAY_S,
                options={"require": ["exp", "sub"], "verify_aud": self.audience is not None},
            )
        except jwt.PyJWTError as e:
            raise Unauthenticated(f"the token is not valid: {e}") from None
        try:
            return Principal(str(claims["sub"]), frozenset(self._roles(claims)))
        except ValueError as e:
            raise Unauthenticated(f"the token's subject or roles are not usable: {e}") from None

    def _roles(self, claims: Mapping[str, Any]) -> list[str]:
        value = claims.get(self.roles_claim, [])
        if isinstance(value, str):
            return value.split()
        if isinstance(value, list) and all(isinstance(r, str) for r in value):
            return value
        raise ValueError(f"claim {self.roles_claim!r} is neither a list nor a string")
