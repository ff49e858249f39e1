"""Who may call what: the pure decision the public listener takes before a call reaches a
cell (docs/security.md).

A method's rule comes from its decorator (:func:`cellactors.public`,
:func:`cellactors.allow`); an undecorated method admits any authenticated caller. With no
authentication scheme configured the node is *open*: every caller is anonymous and admitted
(only on loopback, or with ``--allow-anonymous``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from cellactors.core.principal import Principal

#: The role the change feed (and other reads of a cell's raw history) requires.
FEED_ROLE = "feed"
#: The role that sees what only operators should (idempotency keys in the feed).
ADMIN_ROLE = "admin"


@dataclass(frozen=True)
class Rule:
    """A method's access rule: ``public`` admits anonymous callers; ``roles``, when not
    empty, admits only principals holding one of them."""

    public: bool = False
    roles: frozenset[str] = frozenset()


#: The rule of an undecorated method: authenticated callers, whatever their roles.
AUTHENTICATED = Rule()


class Verdict(Enum):
    ALLOWED = "allowed"
    UNAUTHENTICATED = "unauthenticated"  # 401: who are you?
    FORBIDDEN = "forbidden"  # 403: not you


def decide(rule: Rule, caller: Principal | None, *, open_node: bool) -> Verdict:
    """Whether ``caller`` may call a method whose rule is ``rule``."""
    if open_node:
        return Verdict.ALLOWED
    if caller is None:
        return Verdict.ALLOWED if rule.public and not rule.roles else Verdict.UNAUTHENTICATED
    if rule.roles and not caller.has_any(rule.roles):
        return Verdict.FORBIDDEN
    return Verdict.ALLOWED


def decide_role(role: str, caller: Principal | None, *, open_node: bool) -> Verdict:
    """Whether ``caller`` holds ``role`` (the feed's rule; ``admin`` holds every role)."""
    return decide(Rule(roles=frozenset({role, ADMIN_ROLE})), caller, open_node=open_node)
