"""A node's tunables (:class:`NodeSettings`) and how calls between cells reach a peer
(:data:`Forwarder`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cellactors.actors.snapshots import SnapshotPolicy
from cellactors.core.dead_letters import DeadLetterPolicy
from cellactors.core.principal import Principal
from cellactors.core.read_budget import DEFAULT_BUDGET_S
from cellactors.errors import ConfigError, RemoteOwner
from cellactors.persistence.celldb import calls

#: Seconds without a call after which a resident cell's SQLite caches are handed back
#: (``PRAGMA shrink_memory``; about a third of an idle cell's memory).
TRIM_AFTER_S = 2.0


@dataclass
class NodeSettings:
    """Tunables of a node; the defaults match docs/protocol.md."""

    lease_ttl: float = 10.0
    #: Debug mode (``serve --debug``; on in ``cellactors.testing``): error answers to remote
    #: callers carry the traceback of a failed method (docs/writing-a-cell.md).
    debug: bool = False
    op_deadline: float = 15.0
    call_timeout: float = 30.0
    #: Idle seconds before a cell is released (passivated): ownership given up, its file kept
    #: only as a local copy that a later activation of this process may reuse.
    idle_timeout: float = 300.0
    #: Idle seconds before a resident cell hibernates: it keeps its ownership and its file but
    #: holds no thread, connection or file descriptor, and wakes with no bucket request.
    #: Hibernation is off when this is not below ``idle_timeout``.
    hibernate_timeout: float = 30.0
    max_resident_cells: int = 10_000
    max_clock_skew: float | None = None  # seconds; None: TTL/4
    advertise: str = ""
    data_dir: Path | None = None
    snapshots: SnapshotPolicy = field(default_factory=SnapshotPolicy)
    #: How long a cell remembers an idempotency key (a retry after that runs again).
    idempotency_window_s: float = calls.DEFAULT_WINDOW_S
    #: How many keys a cell remembers at most (the oldest are forgotten first).
    idempotency_max_keys: int = calls.DEFAULT_MAX_KEYS
    #: Seconds between two scans of the bucket's due wake entries (one LIST request each
    #: when nothing is due): an alarm of a cell whose node died or was drained fires within
    #: this of its time (once that node's lease expired); a node scans when an alarm of a
    #: cell it released falls due, so those fire within a second.
    alarm_scan_interval: float = 30.0
    #: Seconds a read-only call may take on the serving event loop (``submit_here``): a
    #: method runs there only once its last runs each took less, and its SQL is interrupted
    #: (and the call run again in a worker thread) past it.
    loop_read_budget: float = DEFAULT_BUDGET_S
    #: An outbox message is a dead letter after this many deliveries refused because the
    #: target serves no such class or method (at once when refused for good or it raised).
    outbox_max_attempts: int = 10
    #: ... or once it has been undelivered this many seconds, for any reason.
    outbox_max_age: float = 3600.0

    def __post_init__(self) -> None:
        self.retention()  # refuse bad idempotency settings when the node is configured
        if not self.alarm_scan_interval > 0:
            raise ConfigError(f"alarm scan interval must be positive: {self.alarm_scan_interval}")
        try:
            DeadLetterPolicy(self.outbox_max_attempts, self.outbox_max_age)
        except ValueError as err:
            raise ConfigError(f"outbox dead-letter bounds: {err}") from err

    def retention(self) -> calls.Retention:
        """The idempotency-key retention these settings describe."""
        return calls.Retention(self.idempotency_window_s, self.idempotency_max_keys)


#: Sends a call to the live node that owns the cell (``cellactors serve`` installs a
#: signed HTTP forwarder; in-process fleets may call the owner's ``Node`` directly):
#: ``(owner, cls_name, name, method, kwargs, key, chain, caller) -> result``.
Forwarder = Callable[
    [RemoteOwner, str, str, str, dict[str, Any], str | None, tuple[str, ...], Principal | None],
    Any,
]
