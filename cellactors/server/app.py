"""The node's two HTTP apps.

*Public* (``POST /cells/{cls}/{name}/{method}``, ``GET /cells/{cls}/{name}/changes``,
``GET /healthz``) takes calls from clients and forwards them, signed, to the owning node when
the runtime says another live node owns the cell; any node serves a cell's change feed from
the bucket. *Internal* (``POST /internal/cells/...``, ``GET /state``, ``GET /metrics``,
``GET /fleet``, ``GET /healthz``, the fleet page at ``GET /``, and a cell's dead letters at
``/cells/{cls}/{name}/dead-letters``) takes signed forwarded calls from peers plus operator
endpoints (those of dead letters signed too: they show and change message arguments); it
must listen on a private address. The public
app has no internal route at all.

Calls into the node block (the answer waits for durability), so they run in worker threads
under a capacity limiter: a slow cell never blocks the event loop or health checks.

Every error answer says whether the call ran (``outcome``: ``not_run``, ``unknown`` or
``failed``, see :mod:`cellactors.errors`), and is a JSON (or msgpack) body even when the
request dies in an unexpected way: an outermost guard turns bugs into ``internal``
(``unknown``) and a request cancelled by the server's shutdown into ``not_durable`` (or
``node_unavailable`` if it had not reached the node yet).
"""

from cellactors.server.handling import NODE_HEADER, NodeLike, ServerSettings, error_response
from cellactors.server.internal import build_internal_app
from cellactors.server.public import build_public_app

__all__ = [
    "NODE_HEADER",
    "NodeLike",
    "ServerSettings",
    "build_internal_app",
    "build_public_app",
    "error_response",
]
