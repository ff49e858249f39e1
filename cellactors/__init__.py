"""cellactors: durable, single-instance actors ("cells") with per-cell SQLite state, fenced
and replicated through an S3 or GCS bucket."""

from cellactors.actors.cell import CellActor
from cellactors.actors.node import Node, NodeSettings

__version__ = "0.1.0"

__all__ = ["CellActor", "Node", "NodeSettings", "__version__"]
