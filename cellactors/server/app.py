"""The node's two HTTP apps, as the rest of the project and its users import them.

*Public* (:mod:`.public`): client calls, run here or forwarded to the owning node, and the
change feed. *Internal* (:mod:`.internal`): signed forwarded calls from peers and the
operator endpoints; it must listen on a private address. What both share, including error
answers that always say whether the call ran, is :mod:`.handling`.
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
