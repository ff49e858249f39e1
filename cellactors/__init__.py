"""cellactors: durable, single-instance actors ("cells") with per-cell SQLite state, fenced
and replicated through an S3 or GCS bucket.

The public names load lazily, so ``import cellactors.client`` does not pull in the runtime.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = [
    "AsyncClient",
    "CellActor",
    "Client",
    "Node",
    "NodeSettings",
    "Principal",
    "__version__",
    "allow",
    "public",
    "read_only",
]

if TYPE_CHECKING:
    from cellactors.actors.access import allow, public
    from cellactors.actors.cell import CellActor, read_only
    from cellactors.actors.node import Node, NodeSettings
    from cellactors.async_client import AsyncClient
    from cellactors.client import Client
    from cellactors.core.principal import Principal

_LAZY = {
    "CellActor": "cellactors.actors.cell",
    "read_only": "cellactors.actors.cell",
    "allow": "cellactors.actors.access",
    "public": "cellactors.actors.access",
    "Principal": "cellactors.core.principal",
    "Node": "cellactors.actors.node",
    "NodeSettings": "cellactors.actors.node",
    "Client": "cellactors.client",
    "AsyncClient": "cellactors.async_client",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'cellactors' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
