"""A call's fit to its method, decided without ``Signature.bind`` on the common paths, agrees
with ``bind`` on every shape of signature and call; and the typed fast path converts what
pydantic would convert."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from cellactors import CellActor
from cellactors.actors.cell_runtime import check_arguments
from cellactors.actors.typed import method_types
from cellactors.errors import BadRequest


class Shapes(CellActor):
    def plain(self, a, b=1):  # type: ignore[no-untyped-def]
        return a

    def kwonly(self, a, *, k, j=2):  # type: ignore[no-untyped-def]
        return a

    def posonly(self, a, /, b=1):  # type: ignore[no-untyped-def]
        return a

    def varargs(self, a, *rest, **more):  # type: ignore[no-untyped-def]
        return a

    @staticmethod
    def static(a, b=1):  # type: ignore[no-untyped-def]
        return a

    # Methods whose first parameter cannot take the instance: no call binds.
    def kwargs_only(**kw):  # type: ignore[no-untyped-def]
        return kw

    def keywords_only(*, k=1):  # type: ignore[no-untyped-def]
        return k

    def typed(self, n: int, x: float, s: str = "") -> int:
        return n


CALLS: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
    ((), {}),
    ((1,), {}),
    ((1, 2), {}),
    ((1, 2, 3), {}),
    ((), {"a": 1}),
    ((), {"a": 1, "b": 2}),
    ((1,), {"a": 1}),
    ((1,), {"b": 2}),
    ((), {"b": 2}),
    ((), {"a": 1, "zz": 2}),
    ((1,), {"k": 3}),
    ((), {"a": 1, "k": 3, "j": 4}),
    ((), {"n": 1, "x": 2.0}),
    ((1, 2.0), {"s": "t"}),
]


def _binds(fn: Any, takes_self: bool, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    try:
        inspect.signature(fn).bind(*((None,) if takes_self else ()), *args, **kwargs)
    except TypeError:
        return False
    return True


@pytest.mark.parametrize(
    "method",
    ["plain", "kwonly", "posonly", "varargs", "static", "typed", "kwargs_only", "keywords_only"],
)
@pytest.mark.parametrize(("args", "kwargs"), CALLS)
def test_check_arguments_agrees_with_bind(
    method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    takes_self = method != "static"
    fits = _binds(getattr(Shapes, method), takes_self, args, kwargs)
    try:
        check_arguments(Shapes, method, args, kwargs)
        refused = None
    except BadRequest as err:
        refused = str(err)
    if fits:
        assert refused is None or "bad argument '" in refused  # only a type may refuse it
    else:
        assert refused is not None and refused.startswith("bad arguments for Shapes."), refused


def test_the_fast_path_converts_what_pydantic_would() -> None:
    types = method_types(Shapes, "typed")
    assert types is not None
    args, kwargs = types.convert("Shapes.typed", (), {"n": 1, "x": 2})  # int for a float
    assert (args, kwargs) == ((1, 2.0), {}) and type(args[1]) is float
    args, kwargs = types.convert("Shapes.typed", (1, 2.5), {})  # exact types: unchanged
    assert (args, kwargs) == ((1, 2.5), {})
    with pytest.raises(BadRequest, match="'n'"):
        types.convert("Shapes.typed", ("x",), {"x": 1.0})
    with pytest.raises(BadRequest, match="'n'"):
        types.convert("Shapes.typed", (), {"n": 1.5, "x": 1.0})
    assert types.dump(3) == 3
