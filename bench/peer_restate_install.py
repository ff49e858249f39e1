"""Install the peer of ``python -m bench --peer restate`` into a cache directory, once:
Restate's server from the npm registry (the package ships a native binary per platform)
and its Python SDK from PyPI, into a venv of its own.

The SDK gets its own venv rather than the running interpreter's environment: it is not a
dependency of the project, and it brings its own HTTP/2 server stack (hypercorn, h2, ...)
that must not change what the project's tests and nodes run with. The service process runs
with that venv's interpreter; the suite talks to it only over HTTP.

Anything that keeps the peer from being installed raises :class:`PeerUnavailable` with a
reason the suite prints before it skips.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

SERVER_VERSION = "1.7.12"  # @restatedev/restate-server on npm
SDK_VERSION = "1.3.0"  # restate-sdk on PyPI
HYPERCORN_VERSION = "0.18.0"  # the ASGI server Restate's Python guide serves with
CACHE_ENV = "CELLACTORS_BENCH_CACHE"  # overrides ~/.cache/cellactors-bench
SERVICE = Path(__file__).resolve().parent / "peer_restate_service.py"

_ARCH = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}


class PeerUnavailable(Exception):
    """The peer cannot be installed or started here; the message says why."""


@dataclass(frozen=True)
class RestateInstall:
    """Where the installed peer is: the server binary and the service's interpreter."""

    server: Path
    python: Path
    root: Path

    def service_args(self, port: int) -> list[str]:
        """The command line of the SDK service on ``port`` (``-I``: no project paths, so the
        bench package's ``http`` module cannot shadow the standard library's)."""
        return [str(self.python), "-I", str(SERVICE), "--port", str(port)]


def cache_root(override: Path | None = None) -> Path:
    """``override``, else ``$CELLACTORS_BENCH_CACHE``, else ``~/.cache/cellactors-bench``;
    the peer lives in its ``restate/`` directory."""
    if override is None:
        env = os.environ.get(CACHE_ENV)
        override = Path(env) if env else Path.home() / ".cache" / "cellactors-bench"
    return override / "restate"


def npm_platform() -> str:
    """The suffix of the npm package holding the server binary (``linux-x64``, ...)."""
    system = sys.platform
    arch = _ARCH.get(platform.machine().lower())
    if system not in ("linux", "darwin") or arch is None:
        raise PeerUnavailable(
            f"Restate publishes no server binary on npm for {sys.platform}/{platform.machine()}"
        )
    return f"{system}-{arch}"


def install(override: Path | None = None) -> RestateInstall:
    """Install (or find already installed) the pinned server and SDK under the cache."""
    suffix = npm_platform()
    root = cache_root(override)
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = root / ".writable"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise PeerUnavailable(f"cache directory {root} is not writable: {exc}") from exc
    server = root / "node_modules" / "@restatedev" / f"restate-server-{suffix}" / "bin"
    server = server / "restate-server"
    if not _has_version(server, SERVER_VERSION):
        npm = shutil.which("npm")
        if npm is None:
            raise PeerUnavailable("npm is not on PATH (needed to install restate-server)")
        package = f"@restatedev/restate-server@{SERVER_VERSION}"
        flags = ["--no-audit", "--no-fund", "--ignore-scripts"]  # no telemetry postinstall
        _run([npm, "install", "--prefix", str(root), *flags, package], f"npm install {package}")
        if not _has_version(server, SERVER_VERSION):
            raise PeerUnavailable(f"npm installed no runnable server binary at {server}")
    venv = root / "venv"
    python = venv / "bin" / "python"
    marker = venv / f".installed-{SDK_VERSION}-{HYPERCORN_VERSION}"
    if not marker.exists():
        _run([sys.executable, "-m", "venv", "--clear", str(venv)], "creating the SDK's venv")
        pins = [f"restate-sdk=={SDK_VERSION}", f"hypercorn=={HYPERCORN_VERSION}"]
        pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        _run([*pip, *pins], "pip install of restate-sdk")
        marker.write_text("")
    return RestateInstall(server, python, root)


def _has_version(binary: Path, version: str) -> bool:
    """Whether ``binary`` runs here and says it is ``version``."""
    if not binary.exists():
        return False
    try:
        out = subprocess.run(
            [str(binary), "--version"], capture_output=True, text=True, timeout=30, check=False
        )
    except OSError:
        return False
    return out.returncode == 0 and version in out.stdout


def _run(args: list[str], what: str, timeout: float = 600.0) -> None:
    """Run an installation step; :class:`PeerUnavailable` with its output's tail on failure."""
    try:
        out = subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PeerUnavailable(f"{what} failed: {exc}") from exc
    if out.returncode != 0:
        tail = (out.stderr or out.stdout).strip()[-600:]
        raise PeerUnavailable(f"{what} failed (exit {out.returncode}): {tail}")
