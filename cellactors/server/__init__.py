"""The HTTP layer of a node: the public and internal Starlette apps, the signed forward
between nodes, peer request signing, and the uvicorn runner. What the client shares with
it (bodies, errors, the key header) is :mod:`cellactors.wire`.

Import the submodules directly; this package imports nothing at import time.
"""

from __future__ import annotations
