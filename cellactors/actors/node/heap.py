"""Handing freed heap back to the operating system.

A cell that hibernates or is released frees its SQLite connection, its page cache and its
actors' objects, but glibc's allocator keeps freed memory in its arenas (several, shared by
the node's many threads) and gives it back on its own only from the top of a heap, which a
long-lived object usually holds. RSS then stays where the busiest moment left it.
``malloc_trim(0)`` returns every free page of every arena to the system; the collector
calls it after rounds that trimmed or put cells away (docs/performance.md, row 16).
Elsewhere than glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import sys
from collections.abc import Callable

log = logging.getLogger(__name__)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where there is no glibc (musl, macOS, Windows)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim: Callable[[int], int] = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]  # type: ignore[attr-defined]
    trim.restype = ctypes.c_int  # type: ignore[attr-defined]
    return trim


def release_free_heap() -> bool:
    """Return the allocator's free pages to the system; whether the allocator could (glibc
    says whether any memory was released, which is not needed here)."""
    trim = _malloc_trim()
    if trim is None:
        return False
    try:
        trim(0)
    except OSError as err:  # pragma: no cover - ctypes raises this for a bad call only
        log.debug("malloc_trim failed: %s", err)
        return False
    return True
