"""The keys peer calls are signed and checked with: the fleet key from the bucket, or a
keyring file the operator supplies (``--peer-key-file``), which makes a rotation possible
without downtime and takes the power to sign peer calls away from bucket readers.

A keyring file holds one key per line (64 hex digits; ``#`` comments and blank lines
ignored). The first key signs; every key is accepted. It is read again when it changes
(:mod:`cellactors.server.auth.watched_file`). To rotate: give every node ``old`` then
``new`` (both accepted, old signs), then ``new`` then ``old`` (new signs), then ``new``
alone; at every step each node accepts what any other signs.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass

from cellactors.errors import ConfigError
from cellactors.server import signing
from cellactors.server.auth.watched_file import WatchedFile

_HEX_KEY = re.compile(r"[0-9a-fA-F]{64}")


@dataclass(frozen=True)
class PeerKeys:
    """The key that signs (``signing``) and every key a signature may be made with."""

    signing: bytes
    accepted: tuple[bytes, ...]

    @classmethod
    def single(cls, key: bytes) -> PeerKeys:
        if not isinstance(key, bytes) or len(key) != signing.KEY_BYTES:
            raise ValueError(f"the fleet key must be {signing.KEY_BYTES} bytes")
        return cls(key, (key,))


def parse_keyring(text: str, source: str) -> PeerKeys:
    """The keys of a keyring file; :class:`ConfigError` naming the bad line (never a key)."""
    found: list[bytes] = []
    for n, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if not _HEX_KEY.fullmatch(line):
            raise ConfigError(f"{source}: line {n} is not a key of 64 hex digits")
        found.append(bytes.fromhex(line))
    if not found:
        raise ConfigError(f"{source}: no key (one per line, 64 hex digits; the first signs)")
    return PeerKeys(found[0], tuple(dict.fromkeys(found)))


#: Where the current keys come from (constant, or a file read again when it changes).
KeySource = Callable[[], PeerKeys]


def key_source(keys: bytes | PeerKeys | KeySource) -> KeySource:
    """A :data:`KeySource` for a fleet key, fixed keys, or a source already."""
    if isinstance(keys, bytes):
        fixed = PeerKeys.single(keys)
        return lambda: fixed
    if isinstance(keys, PeerKeys):
        return lambda: keys
    return keys


def keyring_file(path: str | os.PathLike[str]) -> KeySource:
    """The keys of the keyring file at ``path``, kept current."""
    watched = WatchedFile(path, parse_keyring, "peer key file")
    return watched.current
