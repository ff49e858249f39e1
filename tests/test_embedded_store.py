"""The embedded SeaweedFS store (``cellactors serve`` without ``--bucket``) starts even when
another process takes one of the ports it picked before it could bind it, and finds every
object it acknowledged after the machine restarted (its volume indexes are rebuilt)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import boto3
import botocore.config
import pytest

from cellactors.errors import ConfigError
from cellactors.persistence.store.embedded import (
    SeaweedServer,
    boot_id,
    fsync_rule,
    indexes_need_rebuild,
)
from tests.helpers.runtime import eventually
from tests.helpers.stores import env_keys


def _hold(port: int) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen()
    return sock


def test_a_port_taken_before_the_start_moves_the_server_to_fresh_ports(tmp_path: Path) -> None:
    server = SeaweedServer(tmp_path / "store")
    picked = dict(server.ports)
    taken = _hold(picked["master.port"])  # another process got there first
    try:
        server.start()
        try:
            assert server.ports["master.port"] != picked["master.port"]
            assert b"port allocation failed" in server.log_path.read_bytes().lower()
        finally:
            server.stop(grace=0)
    finally:
        taken.close()


def test_an_explicit_s3_port_in_use_is_an_error_not_a_move(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    taken = _hold(port)
    try:
        server = SeaweedServer(tmp_path / "store", s3_port=port)
        with pytest.raises(ConfigError, match=r"exited at start|did not answer"):
            server.start(timeout=20)
        assert server.ports["s3.port"] == port
        server.stop(grace=0)
    finally:
        taken.close()


def test_a_child_started_with_die_with_parent_ends_when_its_parent_is_killed() -> None:
    # The parent starts a long sleep as the store and the benchmark start their children,
    # says its pid, and is SIGKILLed: nothing of it may clean up, Linux ends the child.
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time\n"
            "from cellactors.persistence.store.embedded import die_with_parent\n"
            "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],"
            " preexec_fn=die_with_parent)\n"
            "print(child.pid, flush=True)\n"
            "time.sleep(60)\n",
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert _alive(child)
        parent.kill()
        parent.wait(10)
        eventually(lambda: not _alive(child), timeout=10)
    finally:
        parent.kill()
        parent.wait(10)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie counts as ended: only its parent could reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _objects(server: SeaweedServer, bucket: str, keys: list[str]) -> dict[str, bytes]:
    s3 = boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1")
    return {key: s3.get_object(Bucket=bucket, Key=key)["Body"].read() for key in keys}


def test_after_the_machine_restarted_the_volume_indexes_are_rebuilt_from_the_data(
    tmp_path: Path,
) -> None:
    # SeaweedFS syncs a volume's data file before it answers a PUT, never its index: a power
    # cut may leave the index without the newest needles (here: empty) although the data
    # file holds them. A start on a new boot rebuilds the indexes before weed opens them.
    server = SeaweedServer(tmp_path / "store", credentials=env_keys()).start()
    s3 = boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1")
    s3.create_bucket(Bucket="kept")
    written = {f"k{i}": f"value {i}".encode() * 20 for i in range(5)}
    for key, body in written.items():
        s3.put_object(Bucket="kept", Key=key, Body=body)
    server.stop(grace=0)  # the machine lost power
    indexes = list(server.data_dir.glob("kept_*.idx"))
    assert indexes
    for index in indexes:
        os.truncate(index, 0)  # what of the index had not reached the disk
    (server.data_dir / "indexed-boot").write_text("a boot before the power cut")
    server.start()
    try:
        assert _objects(server, "kept", list(written)) == written
        assert (server.data_dir / "indexed-boot").read_text() == boot_id()
    finally:
        server.stop(grace=0)


def test_indexes_are_rebuilt_on_a_new_or_unknown_boot_only() -> None:
    assert not indexes_need_rebuild("boot-1", "boot-1")
    assert indexes_need_rebuild("boot-1", "boot-2")
    assert indexes_need_rebuild(None, "boot-2")  # never recorded: a store made before
    assert indexes_need_rebuild("boot-1", None)  # this machine cannot tell its boots


def test_the_fsync_rule_is_read_from_the_filer_configuration() -> None:
    rule = b'{"version": 1, "locations": [{"locationPrefix": "/", "fsync": true}]}'
    assert fsync_rule(rule)
    assert not fsync_rule(
        b'{"version": 1, "locations": [{"locationPrefix": "/x/", "fsync": true}]}'
    )
    assert not fsync_rule(b'{"version": 1, "locations": [{"locationPrefix": "/"}]}')
    assert not fsync_rule(b'{"version": 1}')


def test_a_store_started_again_gets_a_fresh_master_and_takes_writes_at_once(
    tmp_path: Path,
) -> None:
    # A master restarted on its own state (its folder is named after its port) may elect
    # itself only seconds later; PUTs wait for it meanwhile (4.6 s in some starts here).
    server = SeaweedServer(tmp_path / "store", credentials=env_keys()).start()
    first = server.ports["master.port"]
    server.stop(grace=0)
    server.start()
    try:
        assert server.ports["master.port"] != first
        s3 = boto3.client(
            "s3",
            endpoint_url=server.endpoint,
            region_name="us-east-1",
            config=botocore.config.Config(retries={"max_attempts": 1}, read_timeout=3),
        )
        s3.create_bucket(Bucket="again")
        s3.put_object(Bucket="again", Key="k", Body=b"v")
    finally:
        server.stop(grace=0)


def test_weed_runs_with_a_lean_garbage_collector_unless_gogc_is_set(
    seaweed: SeaweedServer,
) -> None:
    """Go's collector target for the store is 25 % (docs/performance.md, row 16), or the
    GOGC of the environment."""
    assert seaweed.proc is not None
    environ = Path(f"/proc/{seaweed.proc.pid}/environ").read_bytes().split(b"\0")
    assert f"GOGC={os.environ.get('GOGC', '25')}".encode() in environ
