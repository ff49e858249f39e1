"""Which names of a cell class are callable as its methods (over HTTP and from other cells):
the methods written in its body or its bases', and nothing else a class may hold."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

from cellactors import CellActor, read_only


def logged(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    return wrapper


class Base(CellActor):
    def inherited(self) -> int:
        return 1


class Shop(Base):
    dumps = staticmethod(json.dumps)  # an alias of a function from elsewhere
    partial = functools.partial(print, "x")
    loads = json.loads

    class Nested:
        pass

    def plain(self) -> int:
        return 1

    @staticmethod
    def static() -> int:
        return 2

    @classmethod
    def klass(cls) -> str:
        return cls.__name__

    @read_only
    def reader(self) -> int:
        return 3

    @logged
    def decorated(self) -> int:
        return 4

    def _private(self) -> int:
        return 5


def test_only_methods_written_in_the_class_or_its_bases_are_exposed() -> None:
    assert Shop.exposed_methods() == {
        "inherited",
        "plain",
        "static",
        "klass",
        "reader",
        "decorated",
    }


def test_a_local_class_exposes_its_methods() -> None:
    class Local(CellActor):
        def hello(self) -> str:
            return "hi"

    assert Local.exposed_methods() == {"hello"}
