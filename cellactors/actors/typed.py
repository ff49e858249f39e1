"""Typed methods: a public method's annotations, checked and converted with pydantic.

A method's parameters are validated against their annotations before the call is sent (a
bad argument is a ``not_run`` :class:`BadRequest` that names the field and the expected
type), converted as the method is called (an ISO string becomes a ``datetime``, a dict a
dataclass), and its result is dumped by its return annotation to the JSON/msgpack-able wire
form. The validators are built once per (class, method); a method with no annotations (or
whose annotations cannot be resolved) has none and costs nothing."""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgpack
from pydantic import PydanticUserError, TypeAdapter, ValidationError
from pydantic_core import PydanticSerializationError

from cellactors.errors import BadRequest, BadResult


@dataclass(frozen=True)
class MethodTypes:
    """The validators of one method: one per annotated parameter, one for the result."""

    signature: inspect.Signature
    takes_self: bool
    params: dict[str, TypeAdapter[Any]]
    result: TypeAdapter[Any] | None
    #: The parameters annotated with a plain scalar type, and that type: a value of exactly
    #: that type is what pydantic would answer, so it is taken as it is (the warm-call cost).
    exact: dict[str, type]
    #: The result's plain scalar type, if it is one (returned as it is when it matches).
    exact_result: type | None
    #: The parameters' names in the order positional arguments fill them.
    positional: tuple[str, ...]

    def convert(
        self, label: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The call's arguments validated and converted to their annotated types; raises
        :class:`BadRequest` naming the first bad field and the type it expects."""
        if not self.params:
            return args, kwargs
        if self._all_exact(args, kwargs):
            return args, kwargs
        lead = (None,) if self.takes_self else ()
        try:
            bound = self.signature.bind(*lead, *args, **kwargs)
        except TypeError:
            return args, kwargs  # check_arguments answers a call that does not bind
        for name, adapter in self.params.items():
            if name not in bound.arguments:
                continue
            if type(bound.arguments[name]) is self.exact.get(name):
                continue
            try:
                bound.arguments[name] = adapter.validate_python(bound.arguments[name])
            except ValidationError as err:
                first = err.errors()[0]
                where = ".".join(str(p) for p in (name, *first["loc"]))
                raise BadRequest(
                    f"bad argument {where!r} for {label}: expected {_type_name(adapter)}: "
                    f"{first['msg']}"
                ) from None
        return bound.args[len(lead) :], bound.kwargs

    def _all_exact(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """Whether every checked argument already has its scalar annotation's exact type,
        so validation would answer it unchanged (plain loops: this is on every call)."""
        exact = self.exact
        if len(exact) != len(self.params) or len(args) > len(self.positional):
            return False
        for name, value in zip(self.positional, args, strict=False):
            want = exact.get(name)
            if want is not None and type(value) is not want:
                return False
        for name, value in kwargs.items():
            want = exact.get(name)
            if want is not None and type(value) is not want:
                return False
        return True

    def dump(self, value: Any) -> Any:
        """``value`` in its wire form by the return annotation: pydantic's Python form when
        msgpack carries it (bytes stay bytes), else its JSON form (datetimes, enums, UUIDs)."""
        if self.result is None or type(value) is self.exact_result:
            return value
        try:
            plain = self.result.dump_python(value)
            try:  # msgpack keeps bytes as bytes: the JSON form only when it must
                msgpack.packb(plain, use_bin_type=True)
                return plain
            except (TypeError, ValueError, OverflowError):
                return self.result.dump_python(value, mode="json")
        except (PydanticSerializationError, ValueError, TypeError) as err:
            raise BadResult(f"the result does not fit its annotation: {err}") from err


def _type_name(adapter: TypeAdapter[Any]) -> str:
    """The expected type as a user reads it (``int``, ``list[str]``, ``Colour``)."""
    core = adapter.core_schema
    return str(core.get("metadata", {}).get("name") or _annotation_of(adapter))


def _annotation_of(adapter: TypeAdapter[Any]) -> str:
    tp = getattr(adapter, "_type", None)
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


@functools.cache
def method_types(cls: type, method: str) -> MethodTypes | None:
    """The validators of ``cls.method`` (cached), or None when it has no annotations."""
    raw = inspect.getattr_static(cls, method, None)
    fn = getattr(cls, method, None)
    if fn is None:
        return None
    try:
        sig = inspect.signature(fn)
        hints = typing.get_type_hints(fn, include_extras=True)
    except (TypeError, ValueError, NameError):
        return None  # Python cannot tell, or a name does not resolve: unchecked as before
    returns = hints.get("return", Any)
    try:
        params = {
            name: TypeAdapter(hints[name])
            for name, p in sig.parameters.items()
            if name in hints
            and hints[name] is not Any
            and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        }
        result = None if returns in (Any, None, type(None)) else TypeAdapter(returns)
    except PydanticUserError:
        return None  # a type pydantic cannot check (an arbitrary class): unchecked as before
    if not params and result is None:
        return None
    exact = {name: hints[name] for name in params if hints[name] in _SCALARS}
    exact_result = returns if returns in _SCALARS else None
    takes_self = inspect.isfunction(raw)
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    positional = [p.name for p in sig.parameters.values() if p.kind in kinds]
    return MethodTypes(
        sig, takes_self, params, result, exact, exact_result, tuple(positional[takes_self:])
    )


#: Types whose exact instances pydantic's lax mode returns unchanged (``bool`` is not an
#: exact ``int``, nor an ``int`` an exact ``float``: those still go through pydantic).
_SCALARS = frozenset({str, int, float, bool, bytes})


def check_types(cls: type, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Raise :class:`BadRequest` (``not_run``) when an argument does not fit its annotation."""
    types = method_types(cls, method)
    if types is not None:
        types.convert(f"{cls.__name__}.{method}", args, kwargs)


def typed_method(cls: type, method: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` (the bound method) taking converted arguments and answering its wire form."""
    types = method_types(cls, method)
    if types is None:
        return fn
    label = f"{cls.__name__}.{method}"

    def call(*args: Any, **kwargs: Any) -> Any:
        args, kwargs = types.convert(label, args, kwargs)
        return types.dump(fn(*args, **kwargs))

    return call
