"""The decorators that say who may call a cell's method (docs/security.md):
:func:`public` admits anonymous callers, :func:`allow` only callers holding one of the
roles named; an undecorated method admits any authenticated caller. On a node with no
authentication scheme (open, on loopback) every caller is admitted whatever they say.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from cellactors.core.access import AUTHENTICATED, Rule

F = TypeVar("F", bound=Callable[..., Any])

_RULE = "__cellactors_access__"


def public(method: F) -> F:
    """Admit anonymous callers to this method (and every authenticated one)."""
    setattr(method, _RULE, Rule(public=True))
    return method


def allow(*roles: str) -> Callable[[F], F]:
    """Admit only callers holding at least one of ``roles``:
    ``@cellactors.allow("admin", "support")``."""
    if not roles or not all(isinstance(r, str) and r for r in roles):
        raise TypeError("allow() takes one or more role names")

    def mark(method: F) -> F:
        setattr(method, _RULE, Rule(roles=frozenset(roles)))
        return method

    return mark


@functools.cache
def rule_of(cls: type, method: str) -> Rule:
    """The access rule of ``cls.method`` (the decorator's, else authenticated callers)."""
    rule = getattr(getattr(cls, method, None), _RULE, None)
    return rule if isinstance(rule, Rule) else AUTHENTICATED
