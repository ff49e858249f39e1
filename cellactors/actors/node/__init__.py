"""The node: the composition root of one process's part of the fleet (:mod:`.node`), and
the parts it composes, each in a module of its own."""

from cellactors.actors.node.calls import Submitted
from cellactors.actors.node.node import Node
from cellactors.actors.node.settings import TRIM_AFTER_S, Forwarder, NodeSettings
from cellactors.actors.node.status import NodeStatus

__all__ = ["TRIM_AFTER_S", "Forwarder", "Node", "NodeSettings", "NodeStatus", "Submitted"]
