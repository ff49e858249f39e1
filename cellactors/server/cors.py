"""Cross-origin calls from browsers: off unless origins are allowed (``--cors-origin``).

The public listener takes only JSON and msgpack bodies, so a page on another origin cannot
send a call without a CORS preflight; the preflight is answered only for the origins
allowed here, with the methods and headers a call needs (``Authorization`` included, never
cookies: credentials are bearer tokens a page must hold on purpose).
"""

from __future__ import annotations

from collections.abc import Sequence

from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware

from cellactors.server.handling import NODE_HEADER
from cellactors.wire.codec import IDEMPOTENCY_HEADER

#: How long a browser may cache a preflight's answer, in seconds.
PREFLIGHT_MAX_AGE = 600


def check_origin(origin: str) -> str:
    """``origin`` if it is ``scheme://host[:port]`` (no path, no wildcard); else ValueError."""
    scheme, sep, rest = origin.partition("://")
    if scheme not in ("http", "https") or not sep or not rest or "/" in rest or "*" in rest:
        raise ValueError(f"a CORS origin is scheme://host[:port], not {origin!r}")
    return origin


def middleware(origins: Sequence[str]) -> Middleware:
    """The CORS middleware for ``origins``."""
    return Middleware(
        CORSMiddleware,
        allow_origins=[check_origin(o) for o in origins],
        allow_methods=["GET", "POST"],
        # last-event-id: what a reconnecting EventSource sends (the feed as events).
        allow_headers=[
            "authorization",
            "content-type",
            "accept",
            "last-event-id",
            IDEMPOTENCY_HEADER.lower(),
        ],
        expose_headers=[NODE_HEADER, "retry-after"],
        allow_credentials=False,
        max_age=PREFLIGHT_MAX_AGE,
    )
