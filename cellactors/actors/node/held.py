"""What the activation catalogue keeps of a hibernated cell, and the stores it works with."""

from __future__ import annotations

from dataclasses import dataclass

from cellactors.actors.ownership import LocalCopy
from cellactors.persistence.control.leases import LeaseStore
from cellactors.persistence.control.ownership import OwnershipStore
from cellactors.persistence.store.bucket import Bucket


@dataclass(frozen=True)
class Dormant:
    """A hibernated cell: ``own.json`` still names this node at ``copy.epoch`` and
    ``copy.path`` is the file it closed; ``last_used`` is when it was last called."""

    copy: LocalCopy
    last_used: float


@dataclass(frozen=True)
class Stores:
    """The bucket and the control-record stores the catalogue's activations use."""

    gate: Bucket
    ownership: OwnershipStore
    leases: LeaseStore


__all__ = ["Dormant", "Stores"]
