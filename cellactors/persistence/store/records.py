"""JSON wire records stored in the bucket, with strict decoding.

A record that does not decode is a corrupted control plane: it raises
:class:`~cellactors.errors.BucketError` naming the key, instead of being treated as absent.
"""

from __future__ import annotations

import json
from typing import Any

from cellactors.errors import BucketError


def encode(record: dict[str, Any]) -> bytes:
    return json.dumps(record, separators=(",", ":"), sort_keys=True).encode()


def decode(key: str, body: bytes, required: dict[str, type]) -> dict[str, Any]:
    """Decode a JSON object and check the types of its required fields."""
    try:
        value = json.loads(body)
    except (ValueError, UnicodeDecodeError) as err:
        raise BucketError(f"{key} is not valid JSON: {err}") from err
    if not isinstance(value, dict):
        raise BucketError(f"{key} is not a JSON object")
    for field, typ in required.items():
        item = value.get(field)
        if not isinstance(item, typ) or (typ is int and isinstance(item, bool)):
            raise BucketError(f"{key}: field {field!r} missing or not {typ.__name__}")
    return value
