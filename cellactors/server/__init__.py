"""The HTTP layer of a node: the public and internal Starlette apps, their codec, peer
request signing, and the uvicorn runner.

Import the submodules directly; this package imports nothing heavy at import time so that
:mod:`cellactors.client` can reuse :mod:`cellactors.server.codec` without Starlette.
"""

from __future__ import annotations
