"""Every exception of cellactors, and the registry that rebuilds a call error from its wire
form.

Every error a user can meet derives from :class:`CellactorsError`, so callers can catch the
library's failures without catching their own. Errors a call can end with derive from
:class:`CallError` and carry their HTTP status, a stable ``code`` and the call's
``outcome``; :func:`error_from_answer` turns a node's error answer back into that class, for
the client and for calls between nodes alike. The catalogue lives in this one module so that
every layer can raise and catch without importing any other.
"""

from __future__ import annotations

from typing import Any


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
    """A conditional write may or may not have committed (timeout, reset, 5xx): callers
    reconcile by reading the object back, never by retrying blindly."""


class InvalidCellId(ConfigError):
    """A cell id not of the form ``<Class>:<name>`` with the allowed characters."""


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

    status, code, outcome = 404, "unknown_cell", NOT_RUN


class UnknownMethod(UnknownCell):
    """The class has no public method by that name (an :class:`UnknownCell`)."""

    code = "unknown_method"


class BadRequest(CallError):
    """Invalid cell id, malformed body, or arguments not msgpack-serializable."""

    status, code, outcome = 400, "bad_request", NOT_RUN


class MethodFailed(CallError):
    """The cell's method raised; its transaction was rolled back. ``remote_traceback``: the
    node's traceback text, set only by a node in debug mode (docs/writing-a-cell.md)."""

    status = 422
    code = "method_failed"
    outcome = FAILED

    def __init__(self, exc_type: str, message: str, remote_traceback: str | None = None) -> None:
        super().__init__(f"{exc_type}: {message}")
        self.exc_type = exc_type
        self.exc_message = message
        self.remote_traceback = remote_traceback

    def to_dict(self) -> dict[str, object]:
        more = {} if self.remote_traceback is None else {"traceback": self.remote_traceback}
        return {**super().to_dict(), "type": self.exc_type, "detail": self.exc_message, **more}


class NotDurable(CallError):
    """The call may have been applied, but that could not be proven (ownership lost, upload
    failed in time, node fenced or reset while the answer was held, the answer lost after
    the call was handed over): retry it only with the same idempotency key."""

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

    status, code, outcome = 307, "remote_owner", NOT_RUN

    def __init__(self, node: str, addr: str, generation: str = "") -> None:
        super().__init__(f"cell is owned by live node {node} at {addr}")
        self.node = node
        self.addr = addr
        self.generation = generation


class StaleRoute(CallError):
    """A forwarded call reached a node that does not own the cell."""

    status, code, outcome = 409, "stale_route", NOT_RUN
    retryable = True


class ActivationFailed(CallError):
    """The cell could not be acquired or restored (e.g. a lost seal race) before the call
    was handed to it; retry later."""

    status, code, outcome, retryable = 503, "activation_failed", NOT_RUN, True


class ActivationRaised(CallError):
    """The cell's ``on_activate`` raised (``exc_type``, ``exc_message``): the cell could not
    open and the call never ran. A bug in the cell's code: not retryable."""

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
    """An idempotency key reused for another method or other arguments; nothing ran."""

    status, code, outcome = 409, "key_conflict", NOT_RUN


class CallCycle(CallError):
    """A call would wait on a cell waiting for it (A calls B calls A): refused before it runs,
    to the calling method; a method that lets it escape answers with it, outcome ``failed``."""

    status, code, outcome = 409, "call_cycle", NOT_RUN


# --- the node and its store ---------------------------------------------------------


class ClockSkew(ConfigError):
    """This machine's clock is off from the store's by more than the allowed bound."""


class Fenced(BucketError):
    """The node fenced itself: the request was refused before it was sent."""


# --- a cell's history in the bucket -------------------------------------------------


class CellVacant(CellactorsError):
    """Not a failure: the cell has never existed (no ownership record), and the activation
    was asked to say so instead of creating it (a read-only call answers from scratch)."""


class SealLost(CellactorsError):
    """Another activation sealed the epoch first; this activation must fail."""


class RestoreHole(CellactorsError):
    """The bucket proves history that its objects cannot rebuild (objects were listed and
    then vanished, or are missing), and listing again did not help. The activation fails
    rather than restore around the hole."""


class ListingLags(RestoreHole):
    """The ownership record proves a txid (the last release recorded it) that the store's
    listings still did not show after waiting: the store lists recent writes late, and the
    activation fails rather than seal them away (`cellactors qualify` checks this)."""


class PointNotRestorable(CellactorsError):
    """A point-in-time restore asked for a point the cell's history does not reach: after
    its last transaction, or before its first."""


class HistoryCollected(CallError):
    """The history asked for was garbage-collected (older than the retention period):
    ``oldest_txid`` is the first txid still in batches, ``snapshot_txid`` the snapshot to
    start from (restore it, then read the feed after it), if any. Nothing changed."""

    status = 410
    code = "history_collected"
    outcome = NOT_RUN
    requested: int = 0
    oldest_txid: int = 0
    snapshot_txid: int | None = None
    snapshot_epoch: int | None = None

    def to_dict(self) -> dict[str, object]:
        return {
            **super().to_dict(),
            "requested": self.requested,
            "oldest_txid": self.oldest_txid,
            "snapshot_txid": self.snapshot_txid,
            "snapshot_epoch": self.snapshot_epoch,
        }


class CellPurging(CallError):
    """The cell is being purged (``own.json`` says so); nothing ran. Purge again to finish."""

    status, code, outcome = 409, "cell_purging", NOT_RUN


class FeedHole(CellactorsError):
    """Objects the cell's history needs are missing (not collected: deleted or lost), and
    listing again did not help."""


# --- the local database -------------------------------------------------------------


class UnsupportedSchema(CellactorsError):
    """The database uses something capture cannot replicate exactly (e.g. virtual tables)."""


class Refused(UnsupportedSchema):
    """User code attempted something the runtime refuses (see the message)."""


class TransactionLost(Refused):
    """SQLite rolled the call's transaction back under the method (``ON CONFLICT ROLLBACK``,
    ``RAISE(ROLLBACK)``, an error it caught) and the method returned: nothing is kept (a
    statement run after that wrote outside any transaction: the file is no longer trusted)."""


# --- the wire -----------------------------------------------------------------------


class PayloadTooLarge(BadRequest):
    """The request body exceeds the configured limit; nothing was executed."""

    status, code = 413, "payload_too_large"

    def __init__(self, message: str, *, drained: bool = True) -> None:
        super().__init__(message)
        self.drained = drained  # False: unread bytes remain, the connection must close


class HeadersTooLarge(CallError):
    """A request's head (request line and headers) was over the listener's size or header
    count limit: refused before the head was read whole, so before anything ran. The
    connection is closed."""

    status = 431
    code = "headers_too_large"
    outcome = NOT_RUN


class RequestTimeout(CallError):
    """A request's head or body did not arrive whole within the listener's timeout: cut off
    (and the connection closed) before the call was handed to the node, so it never ran."""

    status = 408
    code = "request_timeout"
    outcome = NOT_RUN


class UnsupportedMediaType(CallError):
    """A call whose body is not declared ``application/json`` or ``application/msgpack``:
    refused before anything is read, so that a page on another origin cannot make a
    browser send a call without a CORS preflight (a form or ``text/plain`` post)."""

    status = 415
    code = "unsupported_media_type"
    outcome = NOT_RUN


class UnknownHost(CallError):
    """A request to the internal listener named a host that is not one of the node's own
    (``Host``): refused before routing, so that a page whose name was rebound to this
    address (DNS rebinding) cannot read or call the node from a browser."""

    status = 421
    code = "unknown_host"
    outcome = NOT_RUN


class Unauthorized(CallError):
    """A peer request failed signature verification; it was not executed."""

    status, code, outcome = 401, "unauthorized", NOT_RUN


class StaleTarget(Unauthorized):
    """A correctly signed request for another process generation of this node: a replay
    across a restart, or a sender whose route to this node predates its restart. Not
    executed; the sender may look the owner up again."""

    code = "stale_target"


class Unauthenticated(CallError):
    """No credential where the method needs one, or a key or token the node's schemes
    refuse. Refused before the cell is activated: it did not run."""

    status = 401
    code = "unauthenticated"
    outcome = NOT_RUN


class Forbidden(CallError):
    """An authenticated caller the method's rule (or the class's ``authorize``) does not
    admit. Refused before the cell is activated; it did not run."""

    status = 403
    code = "forbidden"
    outcome = NOT_RUN


class PeerRefused(CallError):
    """The owning peer refused our signed forward (key or clock mismatch); not executed."""

    status, code, outcome = 502, "peer_refused", NOT_RUN


class InternalError(CallError):
    """An unexpected failure inside this node; the call's outcome is unknown."""

    status = 500
    code = "internal"


class DeadLetterNotFound(CallError):
    """The cell has no dead letter with that id (retried or purged already, or never)."""

    status, code, outcome = 404, "dead_letter_not_found", NOT_RUN


class SocketGone(CallError):
    """The cell has no such socket (it was closed, or its holder was lost): open a new one."""

    status, code, outcome = 404, "socket_gone", NOT_RUN


class SocketMissed(CallError):
    """A socket resumed after more pushes than the cell keeps: some are lost to it."""

    status, code, outcome = 410, "socket_missed", NOT_RUN


class FeedUnavailable(CallError):
    """The feed could not be served now: a store failure, or the node already serves its
    ``max_feed_streams`` follow streams. Nothing changed; a later request, or another node,
    may succeed."""

    status, code, outcome, retryable = 503, "feed_unavailable", NOT_RUN, True


class BucketUnavailable(CallError):
    """The bucket failed an operator's read before anything changed (the node leases, the
    history a rollback restores from); a later request may succeed."""

    status, code, outcome, retryable = 503, "bucket_unavailable", NOT_RUN, True


class FeedHistoryMissing(CallError):
    """Objects the cell's history needs are missing from the bucket (deleted or lost, not
    collected by retention), and listing again did not bring them back. Nothing changed,
    and asking again will not help: the bucket needs an operator."""

    status, code, outcome, retryable = 500, "history_missing", NOT_RUN, False


# --- errors from their wire form ------------------------------------------------------


def _subclasses(cls: type[CallError]) -> list[type[CallError]]:
    return [c for sub in cls.__subclasses__() for c in (sub, *_subclasses(sub))]


#: Every call error of this module a node answers with whose constructor takes just the
#: message (the others are rebuilt by hand below, or never leave a node).
_BY_CODE: dict[str, type[CallError]] = {
    cls.code: cls
    for cls in _subclasses(CallError)
    if cls not in (MethodFailed, ActivationRaised, HistoryCollected, RemoteOwner, InternalError)
}


def error_from_answer(status: int, payload: Any) -> CallError:
    """Rebuild the error a node answered with (its JSON/msgpack error object). An answer
    that is not one of ours (e.g. a proxy's HTML page) has an ``unknown`` outcome."""
    if not isinstance(payload, dict) or not isinstance(payload.get("error"), str):
        err = CallError(f"HTTP {status}: unexpected answer {str(payload)[:200]!r}")
        err.status = status
        return err
    code = payload["error"]
    message = str(payload.get("message", ""))
    if code in (MethodFailed.code, ActivationRaised.code):
        exc_type = str(payload.get("type", "Exception"))
        detail = str(payload.get("detail", ""))
        if code == MethodFailed.code:
            trace = payload.get("traceback")
            return MethodFailed(exc_type, detail, trace if isinstance(trace, str) else None)
        raised = ActivationRaised(exc_type, detail)
        raised.args = (message,)  # the node's message names the cell
        return raised
    if code == HistoryCollected.code:
        collected = HistoryCollected(message)  # with where to start from again
        for field in ("requested", "oldest_txid", "snapshot_txid", "snapshot_epoch"):
            if field in payload:
                setattr(collected, field, payload[field])
        return collected
    cls = _BY_CODE.get(code)
    if cls is not None:
        known, outcome = cls(message), payload.get("outcome")
        known.outcome = outcome if outcome in OUTCOMES else known.outcome  # CallCycle's varies
        return known
    err = CallError(message)
    err.status = status
    err.code = code
    outcome = payload.get("outcome")
    err.outcome = outcome if outcome in OUTCOMES else UNKNOWN
    err.retryable = err.outcome == NOT_RUN and bool(payload.get("retryable", False))
    return err
