"""The OpenAPI 3.1 document of a node's public API: one operation per served class and
public method, its request body from the method's annotations (:mod:`cellactors.actors.typed`),
its answer as ``{"result": ...}``, the error body every failure shares, the
``Idempotency-Key`` header and, on a node with authentication, a bearer scheme. Served at
``GET /openapi.json`` and printed offline by ``cellactors openapi``."""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from typing import Any

from cellactors.actors.typed import method_types

ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["error", "message", "outcome"],
    "properties": {
        "error": {"type": "string", "description": "the error's code (docs/http-api.md)"},
        "message": {"type": "string"},
        "outcome": {
            "type": "string",
            "enum": ["not_run", "unknown", "failed"],
            "description": "whether the call may have run",
        },
        "retryable": {"type": "boolean"},
    },
}

_IDEMPOTENCY_KEY: dict[str, Any] = {
    "name": "Idempotency-Key",
    "in": "header",
    "required": False,
    "description": "a call with a key runs at most once; a retry answers its recorded result",
    "schema": {"type": "string"},
}


def _body_schema(cls: type, method: str, defs: dict[str, Any]) -> dict[str, Any]:
    """The keyword-arguments object of ``cls.method``: typed parameters by their schema,
    untyped ones as any value; required unless they have a default."""
    try:
        sig = inspect.signature(getattr(cls, method))
    except (TypeError, ValueError):
        return {"type": "object"}
    types = method_types(cls, method)
    props: dict[str, Any] = {}
    required: list[str] = []
    for name, param in sig.parameters.items():
        if name in ("self", "cls") or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        adapter = types.params.get(name) if types is not None else None
        props[name] = _schema(adapter, defs, "validation") if adapter is not None else {}
        if param.default is param.empty:
            required.append(name)
    schema: dict[str, Any] = {"type": "object", "properties": props}
    if required:
        schema["required"] = required
    return schema


def _schema(adapter: Any, defs: dict[str, Any], mode: str) -> dict[str, Any]:
    """``adapter``'s JSON schema with its named types moved to ``components/schemas``."""
    schema: dict[str, Any] = adapter.json_schema(
        mode=mode, ref_template="#/components/schemas/{model}"
    )
    defs.update(schema.pop("$defs", {}))
    return schema


def _errors(status_codes: Iterable[str]) -> dict[str, Any]:
    ref = {"$ref": "#/components/schemas/Error"}
    return {
        code: {"description": "the call failed", "content": {"application/json": {"schema": ref}}}
        for code in status_codes
    }


def build_openapi(
    classes: dict[str, type], authenticated: bool = False, title: str = "cellactors"
) -> dict[str, Any]:
    """The document for ``classes`` (class name -> class); ``authenticated`` adds the bearer
    scheme as every call's requirement."""
    defs: dict[str, Any] = {"Error": ERROR_SCHEMA}
    paths: dict[str, Any] = {}
    for cls_name in sorted(classes):
        cls = classes[cls_name]
        exposed = getattr(cls, "exposed_methods", lambda: ())()
        for method in sorted(exposed):
            types = method_types(cls, method)
            result = (
                _schema(types.result, defs, "serialization")
                if types is not None and types.result is not None
                else {}
            )
            doc = inspect.getdoc(getattr(cls, method)) or ""
            operation: dict[str, Any] = {
                "operationId": f"{cls_name}.{method}",
                "tags": [cls_name],
                "summary": doc.split("\n\n")[0].replace("\n", " "),
                "parameters": [
                    {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}},
                    _IDEMPOTENCY_KEY,
                ],
                "requestBody": {
                    "content": {"application/json": {"schema": _body_schema(cls, method, defs)}}
                },
                "responses": {
                    "200": {
                        "description": "the method's result",
                        "content": {
                            "application/json": {
                                "schema": {
                                    "type": "object",
                                    "required": ["result"],
                                    "properties": {"result": result},
                                }
                            }
                        },
                    },
                    **_errors(["400", "default"]),
                },
            }
            paths[f"/cells/{cls_name}/{{name}}/{method}"] = {"post": operation}
    components: dict[str, Any] = {"schemas": defs}
    doc_: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": title, "version": "1"},
        "paths": paths,
        "components": components,
    }
    if authenticated:
        components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        doc_["security"] = [{"bearer": []}]
    return doc_
