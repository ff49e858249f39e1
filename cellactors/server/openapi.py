"""The OpenAPI 3.1 document of a node's public API: one operation per served class and
public method, its request body from the method's annotations (:mod:`cellactors.actors.typed`),
its answer as ``{"result": ...}``, every error answer a call may get with its code and
outcome class (:mod:`.openapi_errors`), the ``Idempotency-Key`` header and, on a node with
authentication, a bearer scheme (optional for ``@public`` methods). Served at
``GET /openapi.json`` and printed offline by ``cellactors openapi``."""

from __future__ import annotations

import inspect
import json
from typing import Any

from pydantic_core import PydanticSerializationError

from cellactors.actors.access import rule_of
from cellactors.actors.typed import method_types
from cellactors.server.openapi_errors import ERROR_SCHEMA, error_responses
from cellactors.wire.codec import BYTES_TAG

__all__ = ["ERROR_SCHEMA", "build_openapi"]

_IDEMPOTENCY_KEY: dict[str, Any] = {
    "name": "Idempotency-Key",
    "in": "header",
    "required": False,
    "description": "a call with a key runs at most once; a retry answers its recorded result",
    "schema": {"type": "string", "pattern": "^[A-Za-z0-9._:-]{1,128}$"},
}

#: Longest cell id (``<Class>:<name>``), as :mod:`cellactors.core.keys` checks it.
_MAX_CELL_ID = 255

#: Bytes in a JSON body: ``{"$bytes": "<base64>"}`` (docs/http-api.md, "Encodings").
_BYTES: dict[str, Any] = {
    "type": "object",
    "description": "bytes, base64-encoded",
    "required": [BYTES_TAG],
    "properties": {
        BYTES_TAG: {
            "type": "string",
            "contentEncoding": "base64",
            "pattern": "^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$",
        }
    },
    "additionalProperties": False,
}

#: The integers msgpack carries: signed and unsigned 64-bit.
_MIN_INT = -(2**63)
_MAX_INT = 2**64 - 1

_DESCRIPTION = (
    "Calls to the cells of this node's application. Each call's body is the object of the "
    "method's keyword arguments, sent as `application/json` (described here) or "
    '`application/msgpack`; its answer is `{"result": ...}` in the same encoding. Every '
    "error answer says whether the call ran (`outcome`). See docs/http-api.md."
)


def _name_param(cls_name: str) -> dict[str, Any]:
    return {
        "name": "name",
        "in": "path",
        "required": True,
        "description": "the cell's name: one cell per (class, name), created by its first call",
        "schema": {
            "type": "string",
            "pattern": "^[A-Za-z0-9_.:$-]+$",
            "maxLength": _MAX_CELL_ID - len(cls_name) - 1,
            "not": {"enum": [".", ".."]},
        },
    }


def _body_schema(cls: type, method: str, defs: dict[str, Any]) -> dict[str, Any]:
    """The keyword-arguments object of ``cls.method``: typed parameters by their schema,
    untyped ones as any value; required unless they have a default; no other key unless the
    method takes ``**kwargs``."""
    try:
        sig = inspect.signature(getattr(cls, method))
    except (TypeError, ValueError):
        return {"type": "object"}
    types = method_types(cls, method)
    props: dict[str, Any] = {}
    required: list[str] = []
    more = False
    for name, param in sig.parameters.items():
        if param.kind is param.VAR_KEYWORD:
            more = True
        if name in ("self", "cls") or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        adapter = types.params.get(name) if types is not None else None
        props[name] = _schema(adapter, defs, "validation") if adapter is not None else {}
        if param.default is param.empty:
            required.append(name)
        else:
            props[name] = _with_default(props[name], param.default, adapter)
    schema: dict[str, Any] = {"type": "object", "properties": props}
    if required:
        schema["required"] = required
    if not more:
        schema["additionalProperties"] = False
    return schema


def _with_default(schema: dict[str, Any], default: Any, adapter: Any) -> dict[str, Any]:
    """``schema`` naming the parameter's default in its JSON form, when it has one (an
    object of no JSON form is left unsaid)."""
    try:
        value = adapter.dump_python(default, mode="json") if adapter is not None else default
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError, PydanticSerializationError):
        return schema
    return {**schema, "default": value}


def _schema(adapter: Any, defs: dict[str, Any], mode: str) -> dict[str, Any]:
    """``adapter``'s JSON schema with its named types moved to ``components/schemas``, in
    its wire form (:func:`_wire_form`)."""
    schema: dict[str, Any] = adapter.json_schema(
        mode=mode, ref_template="#/components/schemas/{model}"
    )
    for name, sub in schema.pop("$defs", {}).items():
        defs[name] = _wire_form(sub, mode)
    wire: dict[str, Any] = _wire_form(schema, mode)
    return wire


def _wire_form(schema: Any, mode: str) -> Any:
    """``schema`` as the wire carries its values: each bytes schema (``format: binary``) as
    JSON carries bytes, ``{"$bytes": <base64>}`` or a string (an argument's UTF-8; in an
    answer, when the result holds a value msgpack cannot carry, docs/writing-a-cell.md), and
    an argument's integers within the 64 bits msgpack carries (a call's arguments are kept
    and forwarded as msgpack)."""
    if isinstance(schema, list):
        return [_wire_form(s, mode) for s in schema]
    if not isinstance(schema, dict):
        return schema
    if schema.get("type") == "string" and schema.get("format") == "binary":
        rest = {k: v for k, v in schema.items() if k not in ("type", "format")}
        return {**rest, "anyOf": [{"$ref": "#/components/schemas/Bytes"}, {"type": "string"}]}
    out = {k: _wire_form(v, mode) for k, v in schema.items()}
    if mode == "validation" and schema.get("type") == "integer":
        out["minimum"] = max(schema.get("minimum", _MIN_INT), _MIN_INT)
        out["maximum"] = min(schema.get("maximum", _MAX_INT), _MAX_INT)
    return out


def _security(cls: type, method: str) -> list[dict[str, list[str]]]:
    """Who may call: a ``@public`` method anonymous callers too, others a bearer."""
    rule = rule_of(cls, method)
    return [{}, {"bearer": []}] if rule.public and not rule.roles else [{"bearer": []}]


def _operation(
    cls_name: str, cls: type, method: str, authenticated: bool, defs: dict[str, Any]
) -> dict[str, Any]:
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
        "parameters": [_name_param(cls_name), _IDEMPOTENCY_KEY],
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": _body_schema(cls, method, defs)}},
        },
        "responses": {
            "200": {
                "description": "the method's result, durable",
                "headers": {
                    "X-Cellactors-Node": {
                        "description": "the node that ran the call",
                        "schema": {"type": "string"},
                    }
                },
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
            **error_responses(authenticated, defs),
        },
    }
    if authenticated:
        rule = rule_of(cls, method)
        operation["security"] = _security(cls, method)
        if rule.roles:
            roles = ", ".join(f"`{r}`" for r in sorted(rule.roles))
            operation["description"] = f"Callers holding one of the roles {roles} only."
    return operation


def build_openapi(
    classes: dict[str, type], authenticated: bool = False, title: str = "cellactors"
) -> dict[str, Any]:
    """The document for ``classes`` (class name -> class); ``authenticated`` adds the bearer
    scheme, required by every call but those of ``@public`` methods."""
    defs: dict[str, Any] = {"Error": ERROR_SCHEMA, "Bytes": _BYTES}
    paths: dict[str, Any] = {}
    for cls_name in sorted(classes):
        cls = classes[cls_name]
        exposed = getattr(cls, "exposed_methods", lambda: ())()
        for method in sorted(exposed):
            paths[f"/cells/{cls_name}/{{name}}/{method}"] = {
                "post": _operation(cls_name, cls, method, authenticated, defs)
            }
    components: dict[str, Any] = {"schemas": defs}
    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": title, "version": "1", "description": _DESCRIPTION},
        "paths": paths,
        "components": components,
    }
    if authenticated:
        components["securitySchemes"] = {
            "bearer": {
                "type": "http",
                "scheme": "bearer",
                "description": "an API key or a JWT, as the node's schemes accept "
                "(docs/security.md)",
            }
        }
        doc["security"] = [{"bearer": []}]
    return doc
