"""Node leases: ``nodes/<node>.json``, renewed with conditional writes.

A lease says which process (generation) holds a node identity, where peers reach it
(``addr``), and until when (``expires_ms``, in the store's time: see
:mod:`cellactors.clock`). Peers treat a lease as dead once the store's time is surely past
its expiry.
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass

from cellactors.core import keys
from cellactors.core.types import PEER_PROTOCOL, LeaseSnapshot, NodeLease
from cellactors.errors import BucketError, InvalidCellId
from cellactors.persistence.store import records
from cellactors.persistence.store.bucket import Bucket, CasResult, Guard

__all__ = [
    "PEER_PROTOCOL",
    "LeaseSnapshot",
    "LeaseStore",
    "ListedLease",
    "NodeLease",
    "encode_lease",
    "list_leases",
]

log = logging.getLogger(__name__)


def encode_lease(lease: NodeLease) -> bytes:
    """The lease as stored; a nonce keeps two writes of equal content from sharing an ETag."""
    return records.encode(
        {
            "node": lease.node,
            "addr": lease.addr,
            "expires_ms": lease.expires_ms,
            "peer_protocol": lease.peer_protocol,
            "generation": lease.generation,
            "load": lease.load,
            "nonce": secrets.token_hex(8),
        }
    )


def _decode_lease(key: str, body: bytes) -> NodeLease:
    value = records.decode(
        key,
        body,
        {"node": str, "addr": str, "expires_ms": int, "peer_protocol": int, "generation": str},
    )
    load = value.get("load")
    return NodeLease(
        node=value["node"],
        addr=value["addr"],
        expires_ms=value["expires_ms"],
        generation=value["generation"],
        peer_protocol=value["peer_protocol"],
        load=load if isinstance(load, dict) else {},
    )


@dataclass(frozen=True)
class ListedLease:
    """One ``nodes/`` object as an operator sees it: the lease, or why it is unreadable;
    ``written_ms`` is the store's last-modified time of the object."""

    node: str
    written_ms: int
    lease: NodeLease | None
    problem: str | None = None


def list_leases(
    bucket: Bucket, modified_since_ms: int | None = None, skip_node: str | None = None
) -> list[ListedLease]:
    """Every node lease in the bucket, expired ones included, in listing (node) order; an
    object not modified since ``modified_since_ms``, or of ``skip_node``, is skipped without
    a read. Keys that name no node are skipped; a lease that does not decode is listed with
    its problem; store failures propagate. Read-only."""
    found: list[ListedLease] = []
    for info in bucket.list(keys.NODES_PREFIX):
        if not info.key.endswith(".json"):
            continue
        if modified_since_ms is not None and info.last_modified_ms < modified_since_ms:
            continue
        node_id = info.key[len(keys.NODES_PREFIX) : -len(".json")]
        if node_id == skip_node:
            continue
        try:
            key = keys.lease_key(node_id)
        except InvalidCellId:
            continue  # not a lease key, e.g. nodes/sub/x.json
        obj = bucket.get(key)
        if obj is None:
            continue  # deleted since the listing
        try:
            found.append(ListedLease(node_id, info.last_modified_ms, _decode_lease(key, obj.body)))
        except BucketError as err:
            found.append(ListedLease(node_id, info.last_modified_ms, None, str(err)))
    return found


def _readable(listed: list[ListedLease]) -> list[NodeLease]:
    """The leases that decoded and name the node their key names (others are logged)."""
    leases = []
    for item in listed:
        if item.lease is None:
            log.warning("skipping unreadable lease of %s: %s", item.node, item.problem)
        elif item.lease.node == item.node:
            leases.append(item.lease)
    return leases


class LeaseStore:
    """Reads and writes node leases on behalf of one node."""

    def __init__(self, bucket: Bucket, node_id: str, ttl_s: float = 10.0) -> None:
        self.bucket = bucket
        self.node = keys.validate_node_id(node_id)
        self.ttl_s = ttl_s

    def read_lease(self, node_id: str, *, once: bool = False) -> LeaseSnapshot | None:
        """Read a node's lease; ``once`` makes one request without the client's retries."""
        key = keys.lease_key(node_id)
        obj = self.bucket.get_once(key) if once else self.bucket.get(key)
        if obj is None:
            return None
        return LeaseSnapshot(_decode_lease(key, obj.body), obj.token)

    def cas_node_lease(self, guard: Guard, lease: NodeLease) -> CasResult:
        if lease.node != self.node:
            raise ValueError(f"lease for {lease.node!r} written by node {self.node!r}")
        return self.bucket.put_cas(keys.lease_key(self.node), encode_lease(lease), guard)

    def read_all(self) -> list[NodeLease]:
        """Every node lease under ``nodes/``, this node's included, live or expired, by node
        id (the fleet page). Keys that name no valid node and leases that do not decode are
        skipped; store failures propagate."""
        return sorted(_readable(list_leases(self.bucket)), key=lambda lease: lease.node)

    def read_capacity_peers(self, at_ms: int | None = None) -> list[NodeLease]:
        """Live peers speaking our peer protocol, self excluded.

        Objects not modified within ``max(3 x TTL, 60 s)`` are skipped without a read. A key
        that names no valid node, or a lease that does not decode (a stray object, or a
        peer speaking a future format), is skipped rather than failing the whole listing.
        """
        at = self.bucket.clock.now_ms() if at_ms is None else at_ms
        horizon = at - int(max(3 * self.ttl_s, 60.0) * 1000)
        listed = list_leases(self.bucket, modified_since_ms=horizon, skip_node=self.node)
        return [
            lease
            for lease in _readable(listed)
            if lease.is_live(at) and lease.peer_protocol == PEER_PROTOCOL
        ]
