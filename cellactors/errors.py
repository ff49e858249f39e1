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
