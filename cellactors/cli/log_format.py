"""Log output for ``cellactors serve`` and ``cellactors dev``: ``text`` for people, ``json``
(one object per line: time, level, logger, message, and the exception text if any) for log
collectors."""

from __future__ import annotations

import datetime
import json
import logging
import sys

from cellactors.clock import local_time

LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class TextFormatter(logging.Formatter):
    """The text format, its time ISO-like in local time with the offset, to the
    millisecond (``2026-12-03 21:12:37.334+00:00``)."""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return local_time(int(record.created * 1000))


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (newlines in messages are escaped)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, str] = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc)
            .isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exception"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, ensure_ascii=False)


def setup_logging(level: str, log_format: str = "text") -> None:
    """Send every logger's records to stderr at ``level`` in ``log_format``."""
    handler = logging.StreamHandler(sys.stderr)
    if log_format.lower() == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper(), logging.INFO))
