"""The part of pykka's private API that :mod:`cellactors.actors.pykka_ext` relies on, pinned:
a pykka release that renames or reshapes any of it fails here, naming what moved, before
the actors built on it misbehave. The module is the only one in the package that uses it."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pykka
import pytest
from pykka import messages
from pykka._envelope import Envelope

import cellactors

#: pykka.Actor's private hooks and helpers the extension calls or overrides, with the
#: parameters it passes (self excluded).
HOOKS = {
    "_start_actor_loop": [],
    "_actor_loop_setup": [],
    "_handle_failure": ["exception_type", "exception_value", "traceback"],
    "_handle_receive": ["message"],
    "_create_actor_inbox": [],
    "_create_future": [],
    "_stop": [],
}


@pytest.mark.parametrize("name", sorted(HOOKS))
def test_the_actor_hooks_relied_on_are_there(name: str) -> None:
    hook = getattr(pykka.Actor, name, None)
    assert callable(hook), f"pykka.Actor.{name} is gone"
    params = [p for p in inspect.signature(hook).parameters if p != "self"]
    assert params == HOOKS[name], f"pykka.Actor.{name} now takes {params}"


def test_a_threading_actor_starts_its_loop_itself() -> None:
    assert pykka.ThreadingActor._start_actor_loop is not pykka.Actor._start_actor_loop


def test_the_envelope_and_the_stop_message() -> None:
    reply: pykka.ThreadingFuture[None] = pykka.ThreadingFuture()
    stop = messages._ActorStop()
    envelope = Envelope(stop, reply_to=reply)
    assert (envelope.message, envelope.reply_to) == (stop, reply)


def private_pykka_users() -> set[str]:
    """Modules of the package that import a private pykka name or call a private hook."""
    users = set()
    root = Path(cellactors.__file__).parent
    hooks = set(HOOKS) - {"_stop"} | {"_ActorStop"}
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pykka"):
                if (node.module or "").startswith("pykka._") or any(
                    a.name.startswith("_") for a in node.names
                ):
                    users.add(path.name)
            elif isinstance(node, ast.Attribute) and node.attr in hooks:
                users.add(path.name)
    return users


def test_only_the_extension_module_touches_pykka_internals() -> None:
    assert private_pykka_users() == {"pykka_ext.py"}
