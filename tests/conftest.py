"""Fixtures: real store servers on loopback, started by the tests themselves."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from cellactors.persistence.store.embedded import PORT_RANGE_ENV, SeaweedServer
from cellactors.persistence.store.s3 import S3Bucket
from tests.faults.proxy import FaultProxy
from tests.helpers.stores import env_keys, make_s3_bucket

os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")


def _own_ports() -> str:
    """This test process's own block of ports for ``free_port`` (nine blocks of 1,400 from
    20000, below the kernel's ephemeral range that starts at 32768): two xdist workers that
    both start servers can then never pick the same port between its check and its bind
    (which once made one test's node answer another's calls). Assigned, not defaulted: a
    worker inherits its controller's environment."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    index = int(worker[2:]) % 8 if worker.startswith("gw") else 8
    low = 20000 + index * 1400
    return f"{low}-{low + 1399}"


os.environ[PORT_RANGE_ENV] = _own_ports()


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedServer]:
    """One SeaweedFS for the whole session (data in a temp dir), closed as ``serve``'s is;
    its S3 accepts the keys of this environment, which the tests' clients sign with."""
    server = SeaweedServer(tmp_path_factory.mktemp("seaweed"), credentials=env_keys())
    server.start()
    yield server
    server.stop(grace=0)  # throwaway data: no need to wait for a clean shutdown


@pytest.fixture(scope="session")
def moto_server() -> Iterator[str]:
    """moto's threaded server on loopback; returns its endpoint URL."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def sw_bucket(seaweed: SeaweedServer) -> S3Bucket:
    """A fresh bucket on the session's SeaweedFS."""
    return make_s3_bucket(seaweed.endpoint)


@pytest.fixture(params=["seaweed", "moto"])
def s3_endpoint(request: pytest.FixtureRequest) -> str:
    """The endpoint of a real S3 server: SeaweedFS (which checks signatures), then moto's."""
    if request.param == "seaweed":
        return str(request.getfixturevalue("seaweed").endpoint)
    return str(request.getfixturevalue("moto_server"))


@pytest.fixture
def proxy(seaweed: SeaweedServer) -> Iterator[FaultProxy]:
    """A fault proxy in front of the session's SeaweedFS."""
    with FaultProxy(seaweed.endpoint, "unit") as p:
        yield p


# Fixture modules owned by separate areas of the suite.
pytest_plugins = ["tests.helpers.gcs", "tests.helpers.machine_time", "cellactors.testing"]
