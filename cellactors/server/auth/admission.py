"""The public listener's door: who is calling (:class:`.Authentication`) and whether they
may (:mod:`cellactors.core.access`, the method's decorator, the class's ``authorize``),
decided before anything reaches a cell, so a refused call leaves no trace: 401
``unauthenticated`` or 403 ``forbidden``, outcome ``not_run``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cellactors.actors.access import rule_of
from cellactors.core import access
from cellactors.core.principal import Principal
from cellactors.errors import Forbidden, Unauthenticated
from cellactors.server.auth.authentication import Authentication


def _refuse(verdict: access.Verdict, what: str) -> None:
    if verdict is access.Verdict.UNAUTHENTICATED:
        raise Unauthenticated(f"{what} needs an authenticated caller (Authorization: Bearer)")
    if verdict is access.Verdict.FORBIDDEN:
        raise Forbidden(f"the caller may not {what}")


def admit_call(
    auth: Authentication, cls: Any, name: str, method: str, headers: Mapping[str, str]
) -> Principal | None:
    """The caller of ``cls.method`` on cell ``name``, if admitted; else the refusal."""
    caller = auth.authenticate(headers)
    what = f"call {cls.__name__}.{method}"
    _refuse(access.decide(rule_of(cls, method), caller, open_node=auth.open), what)
    if not auth.open and not cls.authorize(caller, name, method):
        raise Forbidden(f"the caller may not {what} on {name!r}")
    return caller


def admit_role(
    auth: Authentication, role: str, headers: Mapping[str, str], what: str
) -> Principal | None:
    """The caller, if it holds ``role`` (or ``admin``); else the refusal."""
    caller = auth.authenticate(headers)
    _refuse(access.decide_role(role, caller, open_node=auth.open), what)
    return caller


def admit_admin(auth: Authentication, headers: Mapping[str, str], what: str) -> Principal | None:
    """The caller, if it is an authenticated ``admin``; else the refusal. A node without an
    authentication scheme refuses everyone: what only operators may do is never open by
    default (use the internal listener's signed routes instead)."""
    if auth.open:
        raise Forbidden(
            f"{what} needs an authenticated admin: this node has no authentication scheme "
            "(--api-keys or --jwt-key)"
        )
    return admit_role(auth, access.ADMIN_ROLE, headers, what)
