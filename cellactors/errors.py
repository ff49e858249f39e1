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


class AmbiguousWrite(BucketError):
    """A conditional write may or may not have committed (timeout, reset, 5xx).

    Callers must reconcile by reading the object back, never by retrying blindly.
    """


class InvalidCellId(ConfigError):
    """A cell id does not match ``<Class>:<name>`` with the allowed characters."""


class CallError(CellactorsError):
    """A cell call failed. ``status`` is the HTTP status the server answers with and
    ``code`` a stable machine-readable name; ``retryable`` tells clients another try (on any
    node) is safe because the call did not take effect or is known not durable."""

    status = 500
    code = "internal"
    retryable = False

    def to_dict(self) -> dict[str, object]:
        return {"error": self.code, "message": str(self), "retryable": self.retryable}


class UnknownCell(CallError):
    """No served CellActor class or no public method by that name."""

    status = 404
    code = "unknown_cell"


class BadRequest(CallError):
    """Invalid cell id, malformed body, or arguments that are not msgpack-serializable."""

    status = 400
    code = "bad_request"


class MethodFailed(CallError):
    """The cell's method raised; its transaction was rolled back."""

    status = 422
    code = "method_failed"

    def __init__(self, exc_type: str, message: str) -> None:
        super().__init__(f"{exc_type}: {message}")
        self.exc_type = exc_type
        self.exc_message = message

    def to_dict(self) -> dict[str, object]:
        return {**super().to_dict(), "type": self.exc_type, "detail": self.exc_message}


class NotDurable(CallError):
    """The write could not be proven durable (ownership lost or upload failed in time).

    The caller must assume the write may or may not be present; the cell was reset.
    """

    status = 503
    code = "not_durable"
    retryable = True


class NodeUnavailable(CallError):
    """This node is draining or fenced and takes no new calls."""

    status = 503
    code = "node_unavailable"
    retryable = True


class RemoteOwner(CallError):
    """The cell is owned by another live node; the call must be forwarded there."""

    status = 307
    code = "remote_owner"

    def __init__(self, node: str, addr: str) -> None:
        super().__init__(f"cell is owned by live node {node} at {addr}")
        self.node = node
        self.addr = addr


class StaleRoute(CallError):
    """A forwarded call reached a node that does not own the cell."""

    status = 409
    code = "stale_route"
    retryable = True


class ActivationFailed(CallError):
    """The cell could not be acquired or restored (e.g. a lost seal race); retry later."""

    status = 503
    code = "activation_failed"
    retryable = True
