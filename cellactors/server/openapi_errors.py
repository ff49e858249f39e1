"""The error answers of a call, as the OpenAPI document describes them: one schema per error
code, each naming its outcome class and whether it is retryable (both fixed by the code,
:mod:`cellactors.errors`), grouped by HTTP status into the responses of every operation."""

from __future__ import annotations

import inspect
from typing import Any

from cellactors import errors as e

#: The body every error answer shares (``CallError.to_dict``).
ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["error", "message", "outcome", "retryable"],
    "properties": {
        "error": {"type": "string", "description": "the error's code (docs/http-api.md)"},
        "message": {"type": "string"},
        "outcome": {
            "type": "string",
            "enum": list(e.OUTCOMES),
            "description": "whether the call ran: not_run (never started), unknown (may have "
            "been applied: retry only with the same Idempotency-Key), failed (ran and was "
            "rolled back)",
        },
        "retryable": {
            "type": "boolean",
            "description": "a transient not_run error: another node or a later try may succeed",
        },
    },
}

#: What a call on the public listener may be answered with besides its result: refused
#: on the wire (408, 413, 415, 431), refused before it runs, failed, or not proven durable.
CALL_ERRORS: tuple[type[e.CallError], ...] = (
    e.BadRequest,
    e.UnknownCell,
    e.UnknownMethod,
    e.RequestTimeout,
    e.KeyConflict,
    e.StaleRoute,
    e.CallCycle,
    e.CellPurging,
    e.PayloadTooLarge,
    e.UnsupportedMediaType,
    e.HeadersTooLarge,
    e.MethodFailed,
    e.BadResult,
    e.InternalError,
    e.ActivationRaised,
    e.PeerRefused,
    e.NodeUnavailable,
    e.ActivationFailed,
    e.NodeStorageFault,
    e.NotDurable,
)
#: The refusals of a node with authentication (never of an open node).
AUTH_ERRORS: tuple[type[e.CallError], ...] = (e.Unauthenticated, e.Forbidden)

#: The router's own answer to a path no route matches (a name with an encoded ``/``).
_NOT_FOUND = ("not_found", 404, e.NOT_RUN, False, "No route matches the path.")

#: Fields some codes add to the shared body, with the ones always present.
_EXTRA: dict[str, tuple[dict[str, Any], list[str]]] = {
    e.MethodFailed.code: (
        {
            "type": {"type": "string", "description": "the exception's class name"},
            "detail": {"type": "string", "description": "the exception's message"},
            "traceback": {
                "type": "string",
                "description": "the node's traceback, from a node in debug mode only",
            },
        },
        ["type", "detail"],
    ),
    e.ActivationRaised.code: (
        {
            "type": {"type": "string", "description": "the exception's class name"},
            "detail": {"type": "string", "description": "the exception's message"},
        },
        ["type", "detail"],
    ),
}

_HEADERS: dict[int, dict[str, Any]] = {
    503: {
        "Retry-After": {
            "description": "seconds to wait before another try",
            "schema": {"type": "integer"},
        }
    }
}


def schema_name(code: str) -> str:
    """The component name of the error ``code``'s schema."""
    return f"Error.{code}"


def _summary(cls: type) -> str:
    """The first sentence of ``cls``'s docstring, in Markdown."""
    text = " ".join((inspect.getdoc(cls) or "").split())
    first = text.split(". ")[0].rstrip(".")
    return first.replace("``", "`").replace(":class:", "") + "."


def _code_schema(code: str, outcome: str, retryable: bool, summary: str) -> dict[str, Any]:
    props: dict[str, Any] = {
        "error": {"const": code},
        "outcome": {"const": outcome},
        "retryable": {"const": retryable},
    }
    extra, required = _EXTRA.get(code, ({}, []))
    schema: dict[str, Any] = {
        "description": f"{summary} Outcome: `{outcome}`.",
        "allOf": [{"$ref": "#/components/schemas/Error"}],
        "properties": {**props, **extra},
    }
    if required:
        schema["required"] = required
    return schema


def error_responses(authenticated: bool, defs: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The error responses of a call by status (each code's schema added to ``defs``)."""
    classes = CALL_ERRORS + (AUTH_ERRORS if authenticated else ())
    defs.setdefault("Error", ERROR_SCHEMA)
    rows = [(c.code, c.status, c.outcome, c.retryable, _summary(c)) for c in classes]
    by_status: dict[int, list[str]] = {}
    lines: dict[int, list[str]] = {}
    for code, status, outcome, retryable, summary in [*rows, _NOT_FOUND]:
        defs[schema_name(code)] = _code_schema(code, outcome, retryable, summary)
        by_status.setdefault(status, []).append(code)
        lines.setdefault(status, []).append(f"- `{code}` ({outcome}): {summary}")
    responses: dict[str, dict[str, Any]] = {}
    for status in sorted(by_status):
        refs = [{"$ref": f"#/components/schemas/{schema_name(c)}"} for c in by_status[status]]
        answer: dict[str, Any] = {
            "description": "\n".join(lines[status]),
            "content": {
                "application/json": {"schema": refs[0] if len(refs) == 1 else {"oneOf": refs}}
            },
        }
        if status in _HEADERS:
            answer["headers"] = _HEADERS[status]
        responses[str(status)] = answer
    return responses
