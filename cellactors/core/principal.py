"""Who called: the principal an authentication scheme vouched for, carried with a call.

A :class:`Principal` travels with a call from the node that authenticated it to the cell
that runs it (signed between nodes), into the calls that cell makes to other cells and
into its outbox messages, so every method down the line sees who started it
(``self.caller``). Anonymous callers have no principal (``None``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

#: A principal's name and roles: printable, no control characters, bounded (they travel in
#: a header and are stored with outbox messages).
_NAME_RE = re.compile(r"[^\x00-\x1f\x7f]{1,256}")
MAX_ROLES = 64
#: The header form of a principal must fit well inside a request head (32 KiB by default),
#: or its calls would be refused (431) only when forwarded.
MAX_ENCODED = 4096


@dataclass(frozen=True)
class Principal:
    """An authenticated caller: its ``name`` (an API key's principal, a token's subject)
    and its ``roles``."""

    name: str
    roles: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME_RE.fullmatch(self.name):
            raise ValueError(f"invalid principal name {str(self.name)[:40]!r}")
        if not isinstance(self.roles, frozenset):
            object.__setattr__(self, "roles", frozenset(self.roles))
        if len(self.roles) > MAX_ROLES:
            raise ValueError(f"a principal has at most {MAX_ROLES} roles")
        for role in self.roles:
            if not isinstance(role, str) or not _NAME_RE.fullmatch(role):
                raise ValueError(f"invalid role {str(role)[:40]!r}")
        if len(encode(self)) > MAX_ENCODED:
            raise ValueError(f"a principal is at most {MAX_ENCODED} bytes as a header")

    def has_any(self, roles: frozenset[str]) -> bool:
        """Whether this principal holds at least one of ``roles``."""
        return not self.roles.isdisjoint(roles)

    def to_wire(self) -> dict[str, Any]:
        return {"name": self.name, "roles": sorted(self.roles)}

    @classmethod
    def from_wire(cls, value: Any) -> Principal:
        """The principal ``value`` (from :meth:`to_wire`) describes, or :class:`ValueError`."""
        if not isinstance(value, dict) or not isinstance(value.get("roles", []), list):
            raise ValueError("a principal is an object with a name and a list of roles")
        return cls(value.get("name"), frozenset(value.get("roles", [])))  # type: ignore[arg-type]


def encode(principal: Principal | None) -> str:
    """The header form of a caller: compact JSON, or the empty string for anonymous."""
    if principal is None:
        return ""
    return json.dumps(principal.to_wire(), separators=(",", ":"), ensure_ascii=True)


def decode(text: str | None) -> Principal | None:
    """The caller a header (or stored) value names; empty or missing is anonymous."""
    if not text:
        return None
    try:
        return Principal.from_wire(json.loads(text))
    except json.JSONDecodeError as e:
        raise ValueError(f"malformed principal: {e}") from None


def scoped_key(key: str, caller: Principal | None, chain: tuple[str, ...] = ()) -> str:
    """The idempotency key as the cell records it. A client's key (a call with no
    ``chain`` of waiting cells) is scoped by its caller, so two callers' equal keys never
    meet; a key a cell chose for a call to another cell (or an anonymous caller's) is
    recorded as given, whoever started the chain."""
    if caller is None or chain:
        return key
    return f"{key}\x1f{caller.name}"
