"""The pure access decision and the decorators that feed it (no server, no store)."""

from __future__ import annotations

import pytest

import cellactors
from cellactors import CellActor, Principal
from cellactors.actors.access import rule_of
from cellactors.core import access, principal
from cellactors.core.access import AUTHENTICATED, Rule, Verdict, decide, decide_role

ALICE = Principal("alice", frozenset({"user"}))
ROOT = Principal("root", frozenset({"admin"}))


class Doors(CellActor):
    @cellactors.public
    def hello(self) -> str:
        return "hi"

    def mine(self) -> str:
        return "yours"

    @cellactors.allow("admin", "support")
    def reset(self) -> None:
        pass


@pytest.mark.parametrize(
    ("method", "caller", "verdict"),
    [
        ("hello", None, Verdict.ALLOWED),
        ("hello", ALICE, Verdict.ALLOWED),
        ("mine", None, Verdict.UNAUTHENTICATED),
        ("mine", ALICE, Verdict.ALLOWED),
        ("reset", None, Verdict.UNAUTHENTICATED),
        ("reset", ALICE, Verdict.FORBIDDEN),
        ("reset", ROOT, Verdict.ALLOWED),
    ],
)
def test_each_rule_admits_whom_it_says(
    method: str, caller: Principal | None, verdict: Verdict
) -> None:
    assert decide(rule_of(Doors, method), caller, open_node=False) is verdict


def test_an_open_node_admits_everyone_to_everything() -> None:
    for method in ("hello", "mine", "reset"):
        assert decide(rule_of(Doors, method), None, open_node=True) is Verdict.ALLOWED


def test_the_decorators_leave_the_methods_exposed_and_undecorated_ones_need_a_caller() -> None:
    assert {"hello", "mine", "reset"} <= Doors.exposed_methods()
    assert rule_of(Doors, "mine") == AUTHENTICATED
    assert rule_of(Doors, "reset") == Rule(roles=frozenset({"admin", "support"}))
    with pytest.raises(TypeError):
        cellactors.allow()


def test_the_feed_needs_its_role_or_admin() -> None:
    feeder = Principal("f", frozenset({access.FEED_ROLE}))
    assert decide_role(access.FEED_ROLE, feeder, open_node=False) is Verdict.ALLOWED
    assert decide_role(access.FEED_ROLE, ROOT, open_node=False) is Verdict.ALLOWED
    assert decide_role(access.FEED_ROLE, ALICE, open_node=False) is Verdict.FORBIDDEN
    assert decide_role(access.FEED_ROLE, None, open_node=False) is Verdict.UNAUTHENTICATED


def test_a_principal_travels_as_compact_json_and_scopes_keys() -> None:
    assert principal.decode(principal.encode(ALICE)) == ALICE
    assert principal.encode(None) == "" and principal.decode("") is None
    assert principal.scoped_key("k1", None) == "k1"
    assert principal.scoped_key("k1", ALICE) != principal.scoped_key("k1", ROOT)
    # A key a cell chose for its call to another cell is the app's, whoever started it.
    assert (
        principal.scoped_key("k1", ALICE, ("A:a",))
        == "k1"
        == principal.scoped_key("k1", ROOT, ("A:b",))
    )
    with pytest.raises(ValueError, match="bytes"):  # it could not be forwarded
        Principal("x", frozenset(f"role-{i:03d}-" + "é" * 200 for i in range(64)))
    for bad in ('{"name": ""}', '{"name": "a\\n"}', '{"name": "a", "roles": "x"}', "[1]", "{"):
        with pytest.raises(ValueError):
            principal.decode(bad)
