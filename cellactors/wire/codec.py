"""Request and response bodies: JSON by default, msgpack on ``application/msgpack``.

A call's body is an object of keyword arguments; a success answer is ``{"result": value}``
and an error answer is :meth:`CallError.to_dict`. The body is read with a size limit that is
enforced while streaming, so an oversized body never sits in memory.

JSON cannot carry bytes, so bytes travel as ``{"$bytes": "<base64>"}`` in JSON bodies (both
directions); msgpack carries them natively. JSON is strict both ways: ``NaN`` and
``Infinity`` are refused on input and cannot be encoded on output (they are not JSON).

The ``Idempotency-Key`` header and its syntax live here too, because the client, the public
app and the peer signature all need them.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import AsyncIterator
from typing import Any, Literal

import msgpack

from cellactors.core.idempotency import valid_key
from cellactors.errors import BadRequest, CallError, PayloadTooLarge, UnsupportedMediaType

Encoding = Literal["json", "msgpack"]

JSON_TYPE = "application/json"
MSGPACK_TYPE = "application/msgpack"
_MSGPACK_ALIASES = frozenset({MSGPACK_TYPE, "application/x-msgpack", "application/vnd.msgpack"})
CONTENT_TYPES: dict[Encoding, str] = {"json": JSON_TYPE, "msgpack": MSGPACK_TYPE}

DEFAULT_MAX_BODY = 1 << 20
BYTES_TAG = "$bytes"

IDEMPOTENCY_HEADER = "Idempotency-Key"


def idempotency_key(values: list[str]) -> str | None:
    """The request's idempotency key from its ``Idempotency-Key`` header values (None when
    absent); a malformed or repeated header is a :class:`BadRequest`."""
    if not values:
        return None
    if len(values) > 1:
        raise BadRequest(f"{IDEMPOTENCY_HEADER} given {len(values)} times")
    if not valid_key(values[0]):
        raise BadRequest(
            f"invalid {IDEMPOTENCY_HEADER} {values[0][:140]!r}: use 1-128 characters "
            "from [A-Za-z0-9._:-]"
        )
    return values[0]


def _too_large(limit: int, *, drained: bool) -> PayloadTooLarge:
    return PayloadTooLarge(f"request body exceeds the limit of {limit} bytes", drained=drained)


def encoding_for(content_type: str | None) -> Encoding:
    """The encoding a Content-Type selects: msgpack for ``application/msgpack``, else JSON."""
    if not content_type:
        return "json"
    media = content_type.split(";", 1)[0].strip().lower()
    return "msgpack" if media in _MSGPACK_ALIASES else "json"


def check_call_type(content_type: str | None) -> None:
    """Refuse a call body not declared as JSON or msgpack
    (:class:`~cellactors.errors.UnsupportedMediaType`, ``not_run``): the two types a
    browser sends across origins only after a CORS preflight, which the node never grants."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if media != JSON_TYPE and media not in _MSGPACK_ALIASES:
        shown = f"{content_type!r}" if content_type else "no Content-Type"
        raise UnsupportedMediaType(
            f"a call's body must be {JSON_TYPE} or {MSGPACK_TYPE} (even when empty), not {shown}"
        )


async def read_body(
    chunks: AsyncIterator[bytes],
    content_length: str | None,
    limit: int = DEFAULT_MAX_BODY,
    *,
    drain_limit: int | None = None,
) -> bytes:
    """Read a request body of at most ``limit`` bytes or raise :class:`PayloadTooLarge`.

    A declared Content-Length over the limit is refused before reading. Otherwise the limit is
    checked chunk by chunk; once exceeded, up to ``drain_limit`` further bytes (default
    ``4 * limit``) are read and discarded, never stored, so that the client (which is still
    sending) can read the answer instead of meeting a connection reset.
    """
    drain = 4 * limit if drain_limit is None else drain_limit
    declared: int | None = None
    if content_length is not None:
        try:
            declared = int(content_length)
        except ValueError:
            raise BadRequest(f"invalid Content-Length {content_length!r}") from None
        if declared < 0:
            raise BadRequest(f"invalid Content-Length {content_length!r}")
    if declared is not None and declared > limit and declared > drain:
        raise _too_large(limit, drained=False)
    parts: list[bytes] = []
    total = 0
    async for chunk in chunks:
        total += len(chunk)
        if total > limit:
            break
        parts.append(chunk)
    else:
        return b"".join(parts)
    async for chunk in chunks:
        total += len(chunk)
        if total > drain:
            raise _too_large(limit, drained=False)
    raise _too_large(limit, drained=True)


def _json_default(value: object) -> object:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {BYTES_TAG: base64.b64encode(bytes(value)).decode("ascii")}
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _json_hook(obj: dict[str, Any]) -> Any:
    if len(obj) == 1 and BYTES_TAG in obj and isinstance(obj[BYTES_TAG], str):
        try:
            return base64.b64decode(obj[BYTES_TAG], validate=True)
        except (binascii.Error, ValueError):
            return obj
    return obj


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    """A JSON number as a float, refused when it does not fit one (``1e400`` would become
    infinity, which no JSON answer or feed record could carry back)."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:40]} is out of range")
    return value


#: How deeply a call's arguments may nest (objects and arrays): far beyond any real call,
#: well within what every layer below (msgpack, SQLite, the argument digest) handles.
MAX_NESTING = 64


def check_arguments_shape(value: Any) -> None:
    """Refuse (:class:`BadRequest`, ``not_run``) arguments nested deeper than
    :data:`MAX_NESTING`, or holding a float that is not finite (msgpack can carry one; no
    JSON reader of the answer or the feed could)."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            raise BadRequest(f"arguments hold the number {item}, which JSON cannot carry")
        if isinstance(item, dict | list | tuple):
            if depth >= MAX_NESTING:
                raise BadRequest(f"arguments nest deeper than {MAX_NESTING} levels")
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)


# What ``json.dumps(value, default=..., separators=..., allow_nan=False)`` would build on
# every call (it keeps no state between calls, so one serves every thread).
_JSON = json.JSONEncoder(default=_json_default, separators=(",", ":"), allow_nan=False)
#: One decoder for every body: ``json.loads`` with hooks builds a decoder (and its scanner)
#: per call, about 10 us, which is a few percent of a warm read's CPU on a node.
_JSON_DECODER = json.JSONDecoder(
    object_hook=_json_hook, parse_constant=_refuse_constant, parse_float=_finite_float
)


def encode(value: Any, encoding: Encoding) -> bytes:
    """Serialize ``value``; raises ``TypeError``/``ValueError``/``OverflowError`` if it
    cannot be encoded (in JSON that includes NaN and infinite floats)."""
    if encoding == "msgpack":
        packed: bytes = msgpack.packb(value, use_bin_type=True)
        return packed
    return _JSON.encode(value).encode("utf-8")


def decode(body: bytes, encoding: Encoding) -> Any:
    """Parse a body; malformed input raises :class:`BadRequest`."""
    try:
        if encoding == "msgpack":
            return msgpack.unpackb(body, raw=False, strict_map_key=False)
        # As json.loads reads bytes: UTF-8, -16 or -32, told apart by the first bytes.
        text = body.decode(json.detect_encoding(body), "surrogatepass")
        return _JSON_DECODER.decode(text)
    except (ValueError, TypeError, RecursionError, msgpack.UnpackException) as e:
        raise BadRequest(f"malformed {encoding} body: {e}") from None


def decode_kwargs(body: bytes, encoding: Encoding) -> dict[str, Any]:
    """Parse a call body into keyword arguments; an empty body means no arguments."""
    if not body.strip():
        return {}
    value = decode(body, encoding)
    if not isinstance(value, dict):
        raise BadRequest(f"body must be an object of keyword arguments, not {type(value).__name__}")
    for key in value:
        if not isinstance(key, str) or not key.isidentifier():
            raise BadRequest(f"argument name {key!r} is not a valid identifier")
    check_arguments_shape(value)
    return value


def encode_result(result: Any, encoding: Encoding) -> bytes:
    """The success body ``{"result": result}``."""
    return encode({"result": result}, encoding)


#: What :func:`encode` raises for a value it cannot carry.
ENCODE_ERRORS = (TypeError, ValueError, OverflowError, RecursionError)


class ResultCheck:
    """A ``result_check`` for ``Node.call``: refuses a result that cannot be encoded in the
    request's encoding, inside the call's transaction, so the call is rolled back (422
    ``bad_result``) instead of committing and then failing to answer.

    The body it encoded is kept, so the answer does not encode the same result twice.
    """

    def __init__(self, encoding: Encoding) -> None:
        self.encoding: Encoding = encoding
        self._result: Any = None
        self._body: bytes | None = None

    def __call__(self, result: Any) -> None:
        try:
            body = encode_result(result, self.encoding)
        except ENCODE_ERRORS as e:
            raise ValueError(f"the result cannot be encoded as {self.encoding}: {e}") from None
        self._result, self._body = result, body

    def body_for(self, result: Any) -> bytes:
        """The success body for ``result``; raises like :func:`encode` if not encodable."""
        if self._body is not None and self._result is result:
            return self._body
        return encode_result(result, self.encoding)


def encode_error(err: CallError, encoding: Encoding) -> bytes:
    """The error body: the error's :meth:`~CallError.to_dict`."""
    return encode(err.to_dict(), encoding)
