"""A configuration file read again when it changes: keys are added, revoked and rotated
without a restart. Changes are looked for at most once a second (a ``stat``, no read); a
file that no longer parses keeps what was read last, and the log says why."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Generic, TypeVar

from cellactors.errors import ConfigError

log = logging.getLogger(__name__)

T = TypeVar("T")

RELOAD_CHECK_S = 1.0


class WatchedFile(Generic[T]):
    """``parse(text, path)`` of the file at ``path``, kept current (thread-safe); the first
    read's :class:`ConfigError` is raised, later ones only logged."""

    def __init__(
        self, path: str | os.PathLike[str], parse: Callable[[str, str], T], what: str
    ) -> None:
        self.path = Path(path)
        self.what = what
        self._parse = parse
        self._lock = threading.Lock()
        self._stamp = self._file_stamp()
        self._value = parse(self._read(), str(self.path))
        self._checked = time.monotonic()

    def _read(self) -> str:
        try:
            return self.path.read_text(encoding="utf-8")
        except OSError as e:
            raise ConfigError(f"cannot read the {self.what} {self.path}: {e.strerror}") from e

    def _file_stamp(self) -> tuple[int, int, int] | None:
        try:
            st = self.path.stat()
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def current(self, now: float | None = None) -> T:
        """The parsed file, read again first if it changed since."""
        now = time.monotonic() if now is None else now
        if now - self._checked < RELOAD_CHECK_S:
            return self._value
        with self._lock:
            if now - self._checked < RELOAD_CHECK_S:
                return self._value
            self._checked = now
            stamp = self._file_stamp()
            if stamp is None or stamp == self._stamp:
                return self._value
            self._stamp = stamp
            try:
                self._value = self._parse(self._read(), str(self.path))
            except ConfigError as e:
                log.error("the %s changed but is unusable; keeping what it said: %s", self.what, e)
                return self._value
        log.info("the %s %s was read again", self.what, self.path)
        return self._value
