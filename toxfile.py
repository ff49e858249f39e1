"""This project's tox plugin (tox loads ``toxfile.py`` from the project root by itself).

On machines whose Pythons come from pyenv, its shims show only the active version, so tox
would report the other matrix Pythons as missing. This hook offers tox every interpreter
pyenv has installed as a discovery candidate (tox's ``--discover``); tox still picks, for
each environment, the one that matches its ``pyXY``. Without pyenv it does nothing.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from tox.plugin import impl

if TYPE_CHECKING:
    from tox.config.sets import ConfigSet
    from tox.session.state import State

_MINOR = re.compile(r"python3\.\d+")


def pyenv_root() -> Path | None:
    """``$PYENV_ROOT``, else what ``pyenv root`` prints, else None."""
    if os.environ.get("PYENV_ROOT"):
        return Path(os.environ["PYENV_ROOT"])
    pyenv = shutil.which("pyenv")
    if pyenv is None:
        return None
    done = subprocess.run([pyenv, "root"], capture_output=True, text=True, check=False)
    return Path(done.stdout.strip()) if done.returncode == 0 and done.stdout.strip() else None


def pyenv_pythons(root: Path | None) -> list[str]:
    """The ``python3.X`` executable of every version pyenv has installed."""
    if root is None or not (root / "versions").is_dir():
        return []
    return [
        str(exe)
        for version in sorted((root / "versions").iterdir())
        for exe in sorted((version / "bin").glob("python3.*"))
        if _MINOR.fullmatch(exe.name)
    ]


@impl
def tox_add_core_config(core_conf: ConfigSet, state: State) -> None:
    options = state.conf.options
    options.discover = [*getattr(options, "discover", []), *pyenv_pythons(pyenv_root())]
