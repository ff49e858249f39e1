"""uvicorn's lines once each. A node runs two uvicorn servers in one process, the public
and the internal listener, and both log their process's lifecycle ("Started server
process", "Application startup complete", "Shutting down", ...) to the one ``uvicorn.error``
logger: every such line came twice. Each server's task names its listener in a context
variable; the internal listener's INFO lines are dropped (the public one says the same for
the process) and its warnings and errors say which listener they come from."""

from __future__ import annotations

import logging
from contextvars import ContextVar

#: The listener ("public" or "internal") whose server task is running, "" outside one.
LISTENER: ContextVar[str] = ContextVar("cellactors_listener", default="")
UVICORN_LOGGER = "uvicorn.error"


class ListenerLines(logging.Filter):
    """Keep one copy of the process's lifecycle lines; tag the internal listener's others."""

    def filter(self, record: logging.LogRecord) -> bool:
        if LISTENER.get() != "internal":
            return True
        if record.levelno <= logging.INFO:
            return False
        record.msg = f"internal listener: {record.msg}"
        return True


def install() -> None:
    """Add the filter to uvicorn's logger, once per process."""
    logger = logging.getLogger(UVICORN_LOGGER)
    if not any(isinstance(f, ListenerLines) for f in logger.filters):
        logger.addFilter(ListenerLines())
