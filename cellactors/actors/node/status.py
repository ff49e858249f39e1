"""A node's status and the rules that follow from it.

A node is ``starting`` until it holds its lease, then ``serving``; a graceful stop passes
through ``draining`` to ``stopped``; a self-fence makes it ``fenced`` for good. What it may
do in each status, given whether its lease deadline has passed, is decided here.
"""

from __future__ import annotations

from enum import Enum


class NodeStatus(str, Enum):
    """Where a node is in its life (compares equal to its lower-case name)."""

    STARTING = "starting"
    SERVING = "serving"
    DRAINING = "draining"
    FENCED = "fenced"
    STOPPED = "stopped"

    def __str__(self) -> str:
        return self.value


#: A node in one of these statuses is still at work (its cells answer, it may write).
WORKING = (NodeStatus.SERVING, NodeStatus.DRAINING)
#: A node in one of these statuses has ended: it writes nothing more.
ENDED = (NodeStatus.FENCED, NodeStatus.STOPPED)


def may_send(status: NodeStatus, deadline_passed: bool) -> bool:
    """Whether the node may still write to the bucket on its own initiative (wake entry
    clean-up, scans): serving or draining, and within its lease deadline."""
    return status in WORKING and not deadline_passed


def may_answer(status: NodeStatus, fenced_once: bool, deadline_passed: bool) -> bool:
    """Whether a held answer may still leave the node, checked right before it does: never
    once fenced; while serving or draining, only before the lease deadline. A node stopped
    gracefully proved its answers before it released its cells, so an answer on its way out
    when the stop completed is still sent."""
    if status is NodeStatus.STOPPED:
        return not fenced_once
    return may_send(status, deadline_passed)
