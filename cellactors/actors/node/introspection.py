"""What a node shows of itself: its state and resident cells (``GET /state``), every
node lease in the bucket (``GET /fleet``), and the gauges its metrics read at scrape."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

import pykka

import cellactors.actors.limits as limits
from cellactors.actors.metrics import NodeSample
from cellactors.actors.node.activations import Activations
from cellactors.actors.node.settings import NodeSettings
from cellactors.actors.storage import StorageHealth
from cellactors.persistence.control.leases import LeaseStore


class Shown(Protocol):
    """What a node shows of itself (the node is one)."""

    @property
    def node_id(self) -> str: ...
    @property
    def generation(self) -> str: ...
    @property
    def status(self) -> str: ...
    @property
    def lease(self) -> pykka.ActorRef[Any]: ...
    @property
    def settings(self) -> NodeSettings: ...
    @property
    def activations(self) -> Activations: ...
    @property
    def storage(self) -> StorageHealth: ...


def node_state(node: Shown) -> dict[str, Any]:
    """The node and its resident cells: per cell its epoch, acked and committed txids,
    ``unacked`` (their difference: answers waiting for the bucket) and ``idle_s`` (seconds
    since its last call or transaction)."""
    activations, storage, settings = node.activations, node.storage, node.settings
    try:
        expires = node.lease.proxy().expires_ms.get(timeout=1)
    except (pykka.Timeout, pykka.ActorDeadError):
        expires = 0
    now = time.monotonic()
    cells = []
    for cid, active in activations.resident():
        channel = active.runtime.channel
        acked = channel.acked  # first: committed read later is never below it
        committed = channel.committed
        cells.append(
            {
                "cell": cid,
                "epoch": active.epoch,
                "acked_txid": acked,
                "committed_txid": committed,
                "unacked": committed - acked,
                "idle_s": round(max(0.0, now - active.runtime.last_used), 3),
                "restored_from": active.restored_from,
            }
        )
    return {
        "node": node.node_id,
        "generation": node.generation,
        "status": node.status,
        "lease_expires_ms": expires,
        "limits": {
            "max_resident_cells": settings.max_resident_cells,
            "max_active_cells_by_open_files": limits.max_active_cells(),
        },
        "cells": cells,
        "hibernated_cells": activations.dormant_count(),
        "storage": storage.state,
    }


def fleet_view(node_id: str, leases: LeaseStore, clock: Callable[[], int]) -> dict[str, Any]:
    """Every node lease in the bucket, live or expired: one listing of ``nodes/`` and one
    read per lease. ``now_ms`` is the store's time (``clock``), which expiries are in."""
    read = leases.read_all()
    now_ms = clock()
    nodes = [
        {
            "node": lease.node,
            "addr": lease.addr,
            "generation": lease.generation,
            "expires_ms": lease.expires_ms,
            "alive": lease.is_live(now_ms),
            "load": lease.load,
            "self": lease.node == node_id,
        }
        for lease in read
    ]
    return {"node": node_id, "now_ms": now_ms, "nodes": nodes}


def sample(node: Shown) -> NodeSample:
    """The gauges of :class:`~cellactors.actors.metrics.NodeMetrics`, read at scrape."""
    resident = unacked = busy = 0
    for _cid, active in node.activations.resident():
        channel = active.runtime.channel
        resident += 1
        acked = channel.acked  # first: committed read later is never below it
        unacked += channel.committed - acked
        busy += 0 if channel.idle() else 1
    return NodeSample(
        node.node_id,
        node.generation,
        node.status,
        resident,
        unacked,
        busy,
        node.activations.dormant_count(),
        node.storage.degraded,
    )


def load(node: Shown) -> dict[str, Any]:
    """What the node's lease advertises to its peers' placement (a degraded node gets no
    cells)."""
    return {
        "resident_cells": node.activations.resident_count(),
        "hibernated_cells": node.activations.dormant_count(),
        "storage": node.storage.state,
    }
