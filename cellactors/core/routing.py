"""When a call that went to a cell's owner may be routed once more.

A node that finds a cell owned by a live peer forwards the call there. If the answer proves
the call ran nowhere and says the route itself was the problem (the owner moved or
restarted, is unreachable or draining, or its storage is failing), the node forgets its
cached route, looks the owner up again and sends the call once more; never a third hop.
Every path that forwards (the public listener, calls between cells, the test fleet)
follows this one rule.
"""

from __future__ import annotations

from cellactors.errors import (
    NOT_RUN,
    CallError,
    NodeStorageFault,
    NodeUnavailable,
    StaleRoute,
)

#: The codes of the answers that send a call to the owner's look-up once more.
REROUTE_CODES = frozenset({StaleRoute.code, NodeUnavailable.code, NodeStorageFault.code})


def reroutable(code: object, outcome: object) -> bool:
    """Whether an answer (its ``error`` code and ``outcome``) lets the call be routed once
    more: it ran nowhere, and a fresh look-up of the owner may send it elsewhere."""
    return outcome == NOT_RUN and code in REROUTE_CODES


def reroutable_error(err: BaseException) -> bool:
    """:func:`reroutable` for a raised error."""
    return isinstance(err, CallError) and reroutable(err.code, err.outcome)
