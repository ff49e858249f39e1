"""One ``cellactors serve`` per data directory. Its cell files (and, without ``--bucket``,
the embedded store) belong to one process: a second ``serve`` on the same directory would
delete the first one's local copies at its start. ``serve.pid`` in the directory is locked
(``flock``) for the life of the process and holds its pid, which a second ``serve`` names
when it refuses to start. The kernel drops the lock when the process ends, however it ends.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from cellactors.cli.failures import EXIT_CONFIG, CommandFailed
from cellactors.persistence.files import private_dir

LOCK_FILE = "serve.pid"
_held: list[int] = []  # the locked files' descriptors, open until the process ends


def hold_data_dir(data_dir: Path) -> None:
    """Lock ``data_dir`` for this process, or fail naming the pid of the one holding it."""
    private_dir(data_dir)
    fd = os.open(data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
        os.close(fd)
        raise CommandFailed(
            f"--data-dir {data_dir} is in use by another cellactors serve (pid {holder}); "
            "stop that one, or give this one its own --data-dir",
            EXIT_CONFIG,
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
    _held.append(fd)
