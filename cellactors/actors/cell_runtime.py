"""What an activation gives its cell (:class:`CellRuntime`), what the cell asks of its node
(:class:`CellServices`), and the checks a call's arguments and result pass on their way in
and out: they must fit the method, and msgpack must carry them unchanged."""

from __future__ import annotations

import functools
import inspect
import itertools
import logging
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgpack

from cellactors.actors.channel import ReplicaChannel
from cellactors.actors.messages import Invoke
from cellactors.actors.typed import check_types
from cellactors.clock import RuntimeClock, StoreClock
from cellactors.core.principal import Principal
from cellactors.core.sockets import Holder
from cellactors.errors import BadRequest, BadResult, MethodFailed
from cellactors.persistence.celldb import calls
from cellactors.persistence.celldb.database import CellDatabase

#: Where an exception raised by the user's code is logged, once, with its traceback.
cells_log = logging.getLogger("cellactors.cells")


def check_serializable(value: Any, what: str = "result") -> None:
    """Raise :class:`BadRequest` unless msgpack can carry ``value`` unchanged."""
    try:
        msgpack.packb(value, use_bin_type=True, strict_types=False)
    except (TypeError, ValueError, OverflowError) as err:
        raise BadRequest(f"{what} is not msgpack-serializable: {err}") from err


def encode_result(value: Any) -> bytes:
    """msgpack of a method's result; :class:`BadResult` when msgpack cannot carry it."""
    try:
        return calls.encode(value)
    except (TypeError, ValueError, OverflowError) as err:
        raise BadResult(f"result is not msgpack-serializable: {err}") from err


def run_result_check(check: Callable[[Any], None], value: Any) -> None:
    """Run the caller's ``result_check``; whatever it raises becomes :class:`BadResult`."""
    try:
        check(value)
    except BadResult:
        raise
    except Exception as err:
        raise BadResult(f"the result was refused: {err}") from err


_signatures: dict[tuple[type, str], inspect.Signature | None] = {}


def bound_arguments(
    cls: type, method: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> dict[str, Any] | None:
    """Parameter name -> value of a call, as ``fn`` would bind it (None if it would not), so a
    key's arguments compare equal whether they were passed by position or by name."""
    if (cls, method) not in _signatures:
        try:
            _signatures[(cls, method)] = inspect.signature(fn)
        except (TypeError, ValueError):
            _signatures[(cls, method)] = None
    sig = _signatures[(cls, method)]
    if sig is None:
        return None
    try:
        return dict(sig.bind(*args, **kwargs).arguments)
    except TypeError:
        return None  # the call will fail as the method is called; nothing is recorded


@dataclass(frozen=True)
class _CallShape:
    """How a call of a method binds its arguments: its signature, whether it takes the
    instance first (a plain method does; a static or class method does not), and what the
    common calls need without ``Signature.bind`` (pure Python, the warm call's cost): the
    names its arguments take by position and by keyword, and the ones it requires."""

    sig: inspect.Signature
    takes_self: bool
    positional: tuple[str, ...]  # by position, in order (none when one is positional-only)
    keywords: frozenset[str]
    required: frozenset[str]
    simple: bool  # no positional-only parameter: the set checks below decide

    def fits(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """Whether the call surely binds (False: let ``bind`` decide and explain)."""
        n = len(args)
        if not self.simple or n > len(self.positional):
            return False
        if not self.keywords.issuperset(kwargs):
            return False
        given = {*self.positional[:n], *kwargs}
        return len(given) == n + len(kwargs) and self.required.issubset(given)


@functools.cache
def _call_shape(cls: type, method: str) -> _CallShape | None:
    """The shape of ``cls.method``'s calls (cached); None when Python cannot tell (a
    builtin): such calls are not checked."""
    raw = inspect.getattr_static(cls, method, None)
    takes_self = inspect.isfunction(raw)
    try:
        sig = inspect.signature(getattr(cls, method))
    except (TypeError, ValueError):
        return None
    every = list(sig.parameters.values())
    params = every[1 if takes_self else 0 :]
    kind = inspect.Parameter
    named = (kind.POSITIONAL_OR_KEYWORD, kind.KEYWORD_ONLY)
    # A method whose first parameter cannot take the instance (``def m(**kw)``, ``def
    # m(*, k)``, ``def m()`` in a class) never binds: ``bind`` says so, not the set checks.
    takes_instance = bool(every) and every[0].kind in (kind.POSITIONAL_ONLY, *named[:1])
    return _CallShape(
        sig,
        takes_self,
        positional=tuple(p.name for p in params if p.kind is kind.POSITIONAL_OR_KEYWORD),
        keywords=frozenset(p.name for p in params if p.kind in named),
        required=frozenset(
            p.name for p in params if p.kind in named and p.default is inspect.Parameter.empty
        ),
        simple=all(p.kind is not kind.POSITIONAL_ONLY for p in params)
        and (takes_instance or not takes_self),
    )


def check_arguments(cls: type, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Raise :class:`BadRequest` (``not_run``) when ``args`` and ``kwargs`` do not fit the
    method's parameters (one missing, one unknown, one given twice): such a call would fail
    before the method's first line, so it is refused before the cell is activated and
    leaves nothing behind."""
    shape = _call_shape(cls, method)
    if shape is None:
        return
    if not shape.fits(args, kwargs):
        try:
            shape.sig.bind(*((None,) if shape.takes_self else ()), *args, **kwargs)
        except TypeError as err:
            raise BadRequest(
                f"bad arguments for {cls.__name__}.{method}"
                f"{sig_text(shape.sig, shape.takes_self)}: {err}"
            ) from None
    check_types(cls, method, args, kwargs)


def sig_text(sig: inspect.Signature, takes_self: bool) -> str:
    """The parameters a caller gives, as ``(name, by=1)``."""
    params = list(sig.parameters.values())[1 if takes_self else 0 :]
    return str(sig.replace(parameters=params, return_annotation=inspect.Signature.empty))


class CellServices(Protocol):
    """What a cell asks of its node: calls to other cells (run here or forwarded)."""

    def call_cell(
        self,
        cls_name: str,
        name: str,
        method: str,
        kwargs: dict[str, Any],
        *,
        key: str | None = None,
        chain: tuple[str, ...] = (),
        caller: Principal | None = None,
    ) -> Any: ...

    @property
    def pushes(self) -> PushLedger:
        """Where the node keeps what it sent the nodes holding its cells' sockets."""
        ...


class PushLedger(Protocol):
    """The node's side of its cells' sockets, as a cell's socket events need it."""

    #: This node, as the owner a holder watches (and as a holder of sockets).
    holder: Holder

    def synced(self, cell_id: str, epoch: int, holder: str, head: int) -> None:
        """A holder's sync answers with the cell's pushes up to ``head``."""


#: Numbers the activations of this process: two activations of one cell, even at the same
#: epoch (a purge starts a cell over at epoch 1), never share one.
_incarnations = itertools.count(1)


@dataclass
class CellRuntime:
    """What an activation gives the actor: identity, epoch, database and channel."""

    cell_id: str
    name: str
    epoch: int
    database: CellDatabase
    channel: ReplicaChannel
    next_txid: int
    last_used: float = field(default_factory=time.monotonic)
    services: CellServices | None = None
    #: The runtime's clock (alarms, key retention, transaction stamps): the node's.
    clock: RuntimeClock = field(default_factory=lambda: RuntimeClock(StoreClock("local")))
    #: The ``last_used`` of the idle period whose memory was last trimmed (node's reaper).
    trimmed_for: float | None = None
    #: Runs a call to a read-only method in the calling thread when the cell is idle
    #: (set by the cell when it opens; see :func:`read_only`). False: send it instead.
    run_inline: Callable[[Invoke], bool] | None = None
    #: Hands the database's caches back in the calling thread if the cell is idle (set
    #: when it opens). False: it is not idle, and nothing was done.
    trim_if_idle: Callable[[], bool] | None = None
    #: This activation among all of the process (an operator's multi-step change, such as a
    #: rollback, checks that its last step reaches the activation its first one saw).
    incarnation: int = field(default_factory=lambda: next(_incarnations))


def user_failure(err: BaseException, what: str) -> MethodFailed:
    """Log ``err`` (raised by user code: a method, ``on_activate``) at ERROR with its
    traceback, and the :class:`MethodFailed` that answers it: the original as its cause and
    the traceback as text (which a listener passes on only in debug mode)."""
    cells_log.error("%s raised %s: %s", what, type(err).__name__, err, exc_info=err)
    text = "".join(traceback.format_exception(err))
    failure = MethodFailed(type(err).__name__, str(err), text)
    failure.__cause__ = err
    return failure
