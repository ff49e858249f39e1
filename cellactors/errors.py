"""Exceptions shared across cellactors.

Every error a user can meet derives from :class:`CellactorsError`, so callers can catch the
library's failures without catching their own.
"""

from __future__ import annotations


class CellactorsError(Exception):
    """Base class of every error raised by cellactors."""


class ConfigError(CellactorsError):
    """A setting is invalid: a bad bucket spec, a conflicting flag, a bad cell id."""


class BucketError(CellactorsError):
    """The object store answered with a definite failure (the operation did not happen)."""


class StoreCredentialsError(BucketError):
    """The store cannot be used with the credentials at hand: none were found, or the store
    rejected them (unknown key, bad signature, expired token, access denied)."""


class StoreUnreachable(BucketError):
    """No connection to the store could be made (refused, connect timeout, unknown host):
    the request never reached the store, so nothing happened."""


class AmbiguousWrite(BucketError):
    """A conditional write may or may not have committed (timeout, reset, 5xx).

    Callers must reconcile by reading the object back, never by retrying blindly.
    """


class InvalidCellId(ConfigError):
    """A cell id does not match ``<Class>:<name>`` with the allowed characters."""


#: The call provably never started: no effect; safe to retry or re-route.
NOT_RUN = "not_run"
#: The call may have been applied: retry only with the same idempotency key.
UNKNOWN = "unknown"
#: The method ran and raised (or its result was refused): rolled back, no effect.
FAILED = "failed"
OUTCOMES = (NOT_RUN, UNKNOWN, FAILED)


class CallError(CellactorsError):
    """A cell call failed. ``status`` is the HTTP status the server answers with, ``code`` a
    stable machine-readable name, and ``outcome`` says whether the call ran: ``not_run``
    (never started), ``unknown`` (may have been applied) or ``failed`` (ran, rolled back).
    ``retryable`` marks the transient ``not_run`` errors (another node or a later try may
    succeed); no other outcome is ever retryable without an idempotency key."""

    status = 500
    code = "internal"
    outcome = UNKNOWN
    retryable = False

    def to_dict(self) -> dict[str, object]:
        return {
            "error": self.code,
            "message": str(self),
            "outcome": self.outcome,
            "retryable": self.retryable,
        }


class UnknownCell(CallError):
    """No served CellActor class by that name."""

    status = 404
    code = "unknown_cell"
    outcome = NOT_RUN


class UnknownMethod(UnknownCell):
    """The class is served but has no public method by that name (a subclass of
    :class:`UnknownCell`, so code catching that keeps working)."""

    code = "unknown_method"


class BadRequest(CallError):
    """Invalid cell id, malformed body, or arguments that are not msgpack-serializable."""

    status = 400
    code = "bad_request"
    outcome = NOT_RUN


class MethodFailed(CallError):
    """The cell's method raised; its transaction was rolled back."""

    status = 422
    code = "method_failed"
    outcome = FAILED

    def __init__(self, exc_type: str, message: str) -> None:
        super().__init__(f"{exc_type}: {message}")
        self.exc_type = exc_type
        self.exc_message = message

    def to_dict(self) -> dict[str, object]:
        return {**super().to_dict(), "type": self.exc_type, "detail": self.exc_message}


class NotDurable(CallError):
    """The call may have been applied, but that could not be proven: the write was not
    proven durable (ownership lost, upload failed in time, node fenced or reset while the
    answer was held), or the answer was lost after the call was handed over.

    The caller must assume the call may or may not have taken effect; retry it only with
    the same idempotency key.
    """

    status = 503
    code = "not_durable"
    outcome = UNKNOWN


class NodeUnavailable(CallError):
    """This node is draining or fenced and took no part of the call (it never reached a
    cell); another node may run it."""

    status = 503
    code = "node_unavailable"
    outcome = NOT_RUN
    retryable = True


class NodeStorageFault(CallError):
    """This node's own storage failed (disk full, I/O error, read-only or unopenable data
    directory) before the call could take effect: nothing of it was applied or shipped, and
    the node gives the cell up so that another node can serve it. A node fault, never the
    caller's: retry, on any node."""

    status = 503
    code = "storage_unavailable"
    outcome = NOT_RUN
    retryable = True

    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(message)
        #: What failed, e.g. ``SQLITE_FULL: database or disk is full`` (not on the wire).
        self.reason = reason or message


class RemoteOwner(CallError):
    """The cell is owned by another live node; the call must be forwarded there."""

    status = 307
    code = "remote_owner"
    outcome = NOT_RUN

    def __init__(self, node: str, addr: str, generation: str = "") -> None:
        super().__init__(f"cell is owned by live node {node} at {addr}")
        self.node = node
        self.addr = addr
        self.generation = generation


class StaleRoute(CallError):
    """A forwarded call reached a node that does not own the cell."""

    status = 409
    code = "stale_route"
    outcome = NOT_RUN
    retryable = True


class ActivationFailed(CallError):
    """The cell could not be acquired or restored (e.g. a lost seal race) before the call
    was handed to it; retry later."""

    status = 503
    code = "activation_failed"
    outcome = NOT_RUN
    retryable = True


class ActivationRaised(CallError):
    """The cell's own ``on_activate`` raised, so the cell could not open and the call never
    ran. A bug in the cell's code, not a fault of the node or the store: trying again gives
    the same answer until the code (or the data it reads) changes, so it is not retryable.
    ``exc_type`` and ``exc_message`` say what it raised."""

    status = 500
    code = "activation_raised"
    outcome = NOT_RUN

    def __init__(self, exc_type: str, message: str, cell_id: str = "") -> None:
        where = f"on_activate of {cell_id}" if cell_id else "on_activate"
        super().__init__(f"{where} raised {exc_type}: {message}")
        self.exc_type = exc_type
        self.exc_message = message

    def to_dict(self) -> dict[str, object]:
        return {**super().to_dict(), "type": self.exc_type, "detail": self.exc_message}


class BadResult(CallError):
    """The method's result cannot be carried back (not msgpack, or not encodable in the
    request's encoding): its transaction was rolled back."""

    status = 422
    code = "bad_result"
    outcome = FAILED


class KeyConflict(CallError):
    """An idempotency key was reused for a different method or different arguments; the
    call was not run."""

    status = 409
    code = "key_conflict"
    outcome = NOT_RUN


class CallCycle(CallError):
    """A call between cells would wait on a cell that is itself waiting for this call (A
    calls B which calls A, directly or through others): it would deadlock, so it is refused
    before it runs. The calling cell's method gets this error and decides what to do."""

    status = 409
    code = "call_cycle"
    outcome = NOT_RUN
