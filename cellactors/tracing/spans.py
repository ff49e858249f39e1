"""The spans cellactors makes, and how their context travels.

Tracing is off until :func:`enable` is given a tracer provider (``cellactors serve
--otlp-endpoint`` does it through :mod:`cellactors.tracing.export`; tests pass an SDK
provider with an in-memory exporter). While it is off every function here returns at its
first line: :func:`span` hands back one shared do-nothing span, :func:`current` and
:func:`parent_from` answer None and :func:`traceparent` the empty string, so the call path
builds no span, attribute or context.

Context crosses what contextvars do not on its own: a cell runs its messages on its own
thread, so a message carries the :func:`current` context of its sender and the cell's span
names it as ``parent``; between nodes it is the W3C ``traceparent`` header, which the
sender signs with the rest of the request; in the outbox it is stored with the message.
"""

from __future__ import annotations

from collections.abc import Iterable
from types import TracebackType
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from cellactors.errors import UNKNOWN, CallError

__all__ = [
    "Context",
    "Span",
    "SpanKind",
    "current",
    "disable",
    "enable",
    "enabled",
    "outcome_of",
    "parent_from",
    "span",
    "traceparent",
]

#: The W3C header a trace context travels in (lowercase: how HTTP/2 and ASGI spell it).
TRACEPARENT = "traceparent"
#: The ``cellactors.outcome`` of a call that answered its result.
OK = "ok"
#: Attribute names (one prefix, so a backend groups them).
CELL = "cellactors.cell"
CLASS = "cellactors.cell.class"
NAME = "cellactors.cell.name"
METHOD = "cellactors.method"
EPOCH = "cellactors.epoch"
TXID = "cellactors.txid"
OUTCOME = "cellactors.outcome"

_PROPAGATOR = TraceContextTextMapPropagator()


class _State:
    """The tracer spans are made with; None while tracing is off."""

    tracer: trace.Tracer | None = None


_STATE = _State()


def enable(provider: trace.TracerProvider) -> None:
    """Trace from now on with ``provider`` (an SDK ``TracerProvider``)."""
    _STATE.tracer = provider.get_tracer("cellactors")


def disable() -> None:
    """Stop tracing: spans already started end as usual, no new one starts."""
    _STATE.tracer = None


def enabled() -> bool:
    """Whether spans are being made."""
    return _STATE.tracer is not None


def outcome_of(error: BaseException | None) -> str:
    """The ``cellactors.outcome`` of an answer: ``ok``, or the error's outcome (``not_run``,
    ``failed``, ``unknown``); an error that is not a call error may have run: ``unknown``."""
    if error is None:
        return OK
    if isinstance(error, CallError):
        return error.outcome
    return UNKNOWN


class Span:
    """One span, started as the current one when entered (with ``parent`` as its parent,
    or the current context's span without one) and ended on exit; an exception leaving it
    sets its outcome unless :meth:`outcome` did."""

    __slots__ = (
        "_attributes",
        "_kind",
        "_links",
        "_name",
        "_outcome_set",
        "_parent",
        "_token",
        "otel",
    )

    def __init__(
        self,
        name: str,
        parent: Context | None,
        kind: SpanKind,
        attributes: dict[str, Any],
        links: list[Link] | None,
    ) -> None:
        self._name = name
        self._parent = parent
        self._kind = kind
        self._attributes = attributes
        self._links = links
        self._outcome_set = False
        self._token: object = None
        self.otel: trace.Span = trace.INVALID_SPAN

    def __enter__(self) -> Span:
        tracer = _STATE.tracer
        if tracer is None:  # turned off since span() was called
            return self
        self.otel = tracer.start_span(
            self._name,
            context=self._parent,
            kind=self._kind,
            attributes=self._attributes,
            links=self._links,
            record_exception=False,
            set_status_on_exception=False,
        )
        self._token = otel_context.attach(trace.set_span_in_context(self.otel, self._parent))
        return self

    def begin(self) -> Span:
        """Start the span without making it the thread's current one (a span that ends in
        another order than it began, such as a batch's among batches in flight); end it
        with :meth:`end`."""
        token_before = self._token
        self.__enter__()
        if self._token is not None and self._token is not token_before:
            otel_context.detach(self._token)  # type: ignore[arg-type]
            self._token = None
        return self

    def end(self) -> None:
        """End a span started with :meth:`begin`."""
        self.__exit__(None, None, None)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is not None and not self._outcome_set:
            self.outcome(exc)
        if self._token is not None:
            otel_context.detach(self._token)  # type: ignore[arg-type]
        self.otel.end()

    def set(self, key: str, value: Any) -> None:
        """Set one attribute (None values are left out)."""
        if value is not None:
            self.otel.set_attribute(key, value)

    def outcome(self, error: BaseException | str | None) -> None:
        """Set ``cellactors.outcome`` (from an error, or given as its name); a call that
        did not answer its result marks the span as an error, with the error's code."""
        self._outcome_set = True
        _set_outcome(self.otel, error)

    def share(self, parent: Context | None, *keys: str) -> None:
        """Copy the attributes ``keys`` of this span onto the span ``parent`` names, when
        that one is still recording in this process: the server span of a call learns the
        epoch and txid its run on the cell's thread got."""
        target = trace.get_current_span(parent) if parent is not None else None
        own = getattr(self.otel, "attributes", None)
        if target is None or not own or not target.is_recording():
            return
        for key in keys:
            if key in own:
                target.set_attribute(key, own[key])

    def context(self) -> Context | None:
        """A context whose current span is this one (None while tracing is off), to name
        as the parent of spans made in another thread."""
        if not self.otel.get_span_context().is_valid:
            return None
        return trace.set_span_in_context(self.otel)


def _set_outcome(otel: trace.Span, error: BaseException | str | None) -> None:
    name = error if isinstance(error, str) else outcome_of(error)
    otel.set_attribute(OUTCOME, name)
    if name != OK:
        code = error.code if isinstance(error, CallError) else None
        if isinstance(error, BaseException) and code is None:
            code = type(error).__name__
        otel.set_status(Status(StatusCode.ERROR, code or name))


class _Off(Span):
    """The span of tracing turned off: entering, setting and ending it do nothing."""

    def __init__(self) -> None:
        super().__init__("", None, SpanKind.INTERNAL, {}, None)

    def __enter__(self) -> Span:
        return self

    def __exit__(self, *_exc: object) -> None:
        return None

    def begin(self) -> Span:
        return self

    def end(self) -> None:
        return None

    def set(self, key: str, value: Any) -> None:
        return None

    def outcome(self, error: BaseException | str | None) -> None:
        return None

    def share(self, parent: Context | None, *keys: str) -> None:
        return None


OFF: Span = _Off()


def span(
    name: str,
    parent: Context | None = None,
    kind: SpanKind = SpanKind.INTERNAL,
    links: Iterable[Context] = (),
    **attributes: Any,
) -> Span:
    """A span to enter with ``with`` (:data:`OFF` while tracing is off). ``attributes`` are
    ``cellactors.*`` names without the prefix, ``.`` written ``_`` (``cell_class``), None
    values left out; ``links`` are contexts of other traces' spans this one relates to (the
    acknowledgement of a batch that carries several calls' transactions)."""
    if _STATE.tracer is None:
        return OFF
    attrs = {_ATTRIBUTE.get(k, "cellactors." + k): v for k, v in attributes.items()}
    attrs = {k: v for k, v in attrs.items() if v is not None}
    linked = [Link(trace.get_current_span(c).get_span_context()) for c in links]
    return Span(name, parent, kind, attrs, linked or None)


_ATTRIBUTE = {"cell_class": CLASS, "cell_name": NAME}


def child(name: str, parent: Context | None = None, **attributes: Any) -> Span:
    """A span under ``parent`` (the current span without one), or :data:`OFF` when there
    is none: work the runtime does on its own (``on_activate``'s transaction, an activation
    for the outbox's worker) makes no trace of its own."""
    if _STATE.tracer is None:
        return OFF
    if not trace.get_current_span(parent).get_span_context().is_valid:
        return OFF
    return span(name, parent, **attributes)


def note(key: str, value: Any) -> None:
    """Set an attribute (a ``cellactors.*`` name) on the current span, if any."""
    if _STATE.tracer is not None and value is not None:
        trace.get_current_span().set_attribute(key, value)


def link_current(ctx: Context | None) -> None:
    """Link the current span to ``ctx``'s span, when both exist: an alarm's fire to the call
    that set it, a trace apart (it may fire hours later, on another node)."""
    if _STATE.tracer is not None and ctx is not None:
        target = trace.get_current_span(ctx).get_span_context()
        if target.is_valid:
            trace.get_current_span().add_link(target)


def note_outcome(error: BaseException | None) -> None:
    """Set the current span's ``cellactors.outcome`` from the answer's error (None: ok)."""
    if _STATE.tracer is not None:
        _set_outcome(trace.get_current_span(), error)


def current() -> Context | None:
    """The current context, for a message to carry to the thread that handles it; None
    while tracing is off, or when no span is current (the runtime's own work, which then
    makes no trace of its own)."""
    if _STATE.tracer is None:
        return None
    ctx = otel_context.get_current()
    return ctx if trace.get_current_span(ctx).get_span_context().is_valid else None


def traceparent(ctx: Context | None = None) -> str:
    """The W3C ``traceparent`` of ``ctx``'s span (the current one without ``ctx``), or the
    empty string while tracing is off or without a span to name."""
    if _STATE.tracer is None:
        return ""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=ctx)
    return carrier.get(TRACEPARENT, "")


def parent_from(value: str | None) -> Context | None:
    """The context a ``traceparent`` value names, to start a span under; None while tracing
    is off or when the value is missing or malformed (a bad one is ignored, never
    refused: it is only a parent)."""
    if _STATE.tracer is None or not value:
        return None
    ctx = _PROPAGATOR.extract({TRACEPARENT: value})
    if not trace.get_current_span(ctx).get_span_context().is_valid:
        return None
    return ctx
