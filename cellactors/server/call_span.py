"""The server span of a call on either listener (``cellactors.call``): a child of the
caller's trace context (the ``traceparent`` a client sent the public listener; the signed
one of a peer on the internal listener), naming the cell and the method, and ending with the
outcome the answer tells the caller. Nothing at all while tracing is off."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.responses import Response

from cellactors.errors import OUTCOMES, UNKNOWN, CallError
from cellactors.tracing import spans
from cellactors.wire import codec


async def traced(
    parent: spans.Context | None,
    cls_name: str,
    name: str,
    method: str,
    answer: Callable[[], Awaitable[Response]],
) -> Response:
    """``answer()`` inside the call's server span: the cell, the method, the answer's
    outcome and HTTP status as attributes."""
    if not spans.enabled():
        return await answer()
    with spans.span(
        "cellactors.call",
        parent,
        spans.SpanKind.SERVER,
        cell=f"{cls_name}:{name}",
        cell_class=cls_name,
        cell_name=name,
        method=method,
    ) as span:
        response = await answer()
        span.outcome(answer_outcome(response))
        span.set("http.response.status_code", response.status_code)
        return response


def answer_outcome(response: Response) -> str:
    """The outcome an answer tells its caller: ``ok`` for a success, else the ``outcome`` of
    its error body (``unknown`` when it has none)."""
    if response.status_code < 400:
        return spans.OK
    try:
        payload = codec.decode(
            bytes(response.body), codec.encoding_for(response.headers.get("content-type"))
        )
    except CallError:
        return UNKNOWN
    outcome = payload.get("outcome") if isinstance(payload, dict) else None
    return outcome if outcome in OUTCOMES else UNKNOWN
