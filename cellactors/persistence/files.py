"""A node's local files are its own: directories it makes are 0700 and database files 0600,
whatever the umask, since they hold every cell's rows (and the embedded store, the fleet's
peer key). A directory given to the node is tightened to 0700 too."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

DIR_MODE = 0o700
FILE_MODE = 0o600


def private_dir(path: Path) -> Path:
    """Make ``path`` (and missing parents) if needed, and leave it readable by this user
    only."""
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    if path.stat().st_mode & 0o777 != DIR_MODE:
        os.chmod(path, DIR_MODE)
    return path


def create_private_file(path: Path, *, exclusive: bool = False) -> None:
    """Create ``path`` empty with mode 0600 unless it exists (``exclusive``: it must not
    exist, and must not be a link either: FileExistsError). A link is never followed."""
    flags = os.O_CREAT | os.O_WRONLY | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags, FILE_MODE)
    except FileExistsError:
        if exclusive:
            raise
        return
    with contextlib.suppress(OSError):
        os.fchmod(fd, FILE_MODE)  # the umask may have taken bits away, never added
    os.close(fd)


def write_private_file(path: Path, data: bytes) -> None:
    """Write ``path`` whole with mode 0600 (a fresh temporary file renamed over it, synced
    with its directory), so a secret is never readable by others, not even for a moment."""
    tmp = path.with_name(path.name + ".tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    flags = os.O_CREAT | os.O_WRONLY | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    with os.fdopen(os.open(tmp, flags, FILE_MODE), "wb") as out:
        os.fchmod(out.fileno(), FILE_MODE)  # the umask may have taken bits away, never added
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)
