"""Static API keys from a JSON file: ``{"<key>": {"principal": "alice", "roles": [...]}}``,
sent as ``Authorization: Bearer <key>``.

Keys are kept only as SHA-256 digests, and looked up by the digest of the presented key
(so no comparison's timing depends on a stored key). The file is read again
when it changes (:mod:`.watched_file`), so keys are added and revoked without a restart.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from typing import Any

from cellactors.core.principal import Principal
from cellactors.errors import ConfigError
from cellactors.server.auth.authentication import bearer_token
from cellactors.server.auth.watched_file import WatchedFile

#: A key shorter than this is refused when the file is read: it could be guessed.
MIN_KEY_LENGTH = 16


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


def parse_keys(text: str, source: str) -> dict[bytes, Principal]:
    """The principals of a keys file, by key digest; :class:`ConfigError` naming what is
    wrong (never the key itself)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{source}: not JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected an object of key -> {{principal, roles}}")
    found: dict[bytes, Principal] = {}
    for n, (key, entry) in enumerate(data.items(), start=1):
        if not isinstance(key, str) or len(key) < MIN_KEY_LENGTH or not key.isprintable():
            raise ConfigError(
                f"{source}: key #{n} is shorter than {MIN_KEY_LENGTH} characters or unprintable"
            )
        if not isinstance(entry, dict) or not isinstance(entry.get("principal"), str):
            raise ConfigError(f"{source}: key #{n} needs a string 'principal'")
        roles: Any = entry.get("roles", [])
        if not isinstance(roles, list) or not all(isinstance(r, str) for r in roles):
            raise ConfigError(f"{source}: key #{n}: 'roles' must be a list of strings")
        try:
            found[_digest(key)] = Principal(entry["principal"], frozenset(roles))
        except ValueError as e:
            raise ConfigError(f"{source}: key #{n}: {e}") from None
    return found


class ApiKeys:
    """The API-key scheme over one file (thread-safe)."""

    name = "api-keys"

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.file = WatchedFile(path, parse_keys, "API keys file")

    def __len__(self) -> int:
        return len(self.file.current())

    def authenticate(self, headers: Mapping[str, str]) -> Principal | None:
        token = bearer_token(headers)
        if token is None:
            return None
        # Looked up by digest: what a lookup's timing could reveal is about the digest of
        # the presented key, which says nothing about any stored key.
        return self.file.current().get(_digest(token))
