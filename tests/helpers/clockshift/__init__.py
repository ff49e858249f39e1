"""A wall clock that jumps in a real process: ``wallshift.c``, built here and preloaded.

:func:`wall_shifter` compiles the library once per test session (gcc) and returns a
:class:`WallShift`: its :attr:`~WallShift.env` goes into a process's environment, and
:meth:`~WallShift.set` moves that process's wall clock at once while it runs. Monotonic
clocks and sleeps are untouched, as with a real step of the wall clock."""

from __future__ import annotations

import shutil
import struct
import subprocess
from pathlib import Path

import pytest

SOURCE = Path(__file__).with_name("wallshift.c")


def build(folder: Path) -> Path:
    """The shared library, compiled into ``folder``; skips the test without a compiler."""
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        pytest.skip("no C compiler to build the wall clock shim (install gcc)")
    library = folder / "wallshift.so"
    if not library.exists():
        folder.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [compiler, "-shared", "-fPIC", "-O2", "-o", str(library), str(SOURCE), "-ldl"],
            check=True,
            capture_output=True,
        )
    return library


class WallShift:
    """The wall clock offset of the processes started with :attr:`env`."""

    def __init__(self, library: Path, path: Path) -> None:
        self.library = library
        self.path = path
        path.write_bytes(struct.pack("<q", 0))

    @property
    def env(self) -> dict[str, str]:
        return {"LD_PRELOAD": str(self.library), "CELLACTORS_WALL_SHIFT_FILE": str(self.path)}

    def set(self, seconds: float) -> None:
        """Move the wall clock to ``seconds`` off the real one (a jump, seen at once)."""
        with open(self.path, "r+b") as f:
            f.write(struct.pack("<q", int(seconds * 1_000_000_000)))
