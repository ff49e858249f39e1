"""The pykka actors: cells, their ownership and replication, the lease, and the node."""

from cellactors.actors.cell import CellActor
from cellactors.actors.node import Node, NodeSettings

__all__ = ["CellActor", "Node", "NodeSettings"]
