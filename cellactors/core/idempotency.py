"""The one rule for idempotency keys, wherever a key enters: a call through HTTP, the
Python client, a call between cells (to a cell on this node or on a peer), the outbox.

A key is 1-128 characters of ``[A-Za-z0-9._:-]``: it travels in an HTTP header (and in the
signed headers between nodes) unchanged, so a key that works for a local target works for
a remote one, and the other way round.
"""

from __future__ import annotations

import re

from cellactors.errors import BadRequest

MAX_KEY_LENGTH = 128
#: The rule in words, for error messages and docs.
KEY_RULE = f"1-{MAX_KEY_LENGTH} characters of [A-Za-z0-9._:-]"

_KEY_RE = re.compile(rf"[A-Za-z0-9._:-]{{1,{MAX_KEY_LENGTH}}}")


def valid_key(key: object) -> bool:
    """Whether ``key`` is a valid idempotency key."""
    return isinstance(key, str) and _KEY_RE.fullmatch(key) is not None


def check_key(key: object) -> str:
    """``key`` if it is valid; else :class:`~cellactors.errors.BadRequest` (``not_run``)."""
    if not valid_key(key):
        raise BadRequest(f"invalid idempotency key {str(key)[:40]!r}: use {KEY_RULE}")
    assert isinstance(key, str)
    return key
