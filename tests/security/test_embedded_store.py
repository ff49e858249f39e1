"""The embedded store of ``cellactors serve`` (no ``--bucket``) is not open to every local
process: its ports listen on loopback only, none serves or changes the bucket (the fleet's
peer key, ``fleet/peer-auth.json``, above all) without the store's keys, and the S3 key pair
the node makes on its first start is kept private and used again after a restart."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import ssl
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import botocore.config
import httpx
import pytest
from botocore.exceptions import ClientError

from cellactors.cli.embedded_store import EMBEDDED_BUCKET
from tests.helpers.fleet import COUNTER_APP, NodeProc

PEER_KEY = "fleet/peer-auth.json"
_PORTS_LINE = re.compile(r"embedded store serving s3://\S+ at \S+ \(.*loopback: ([^)]*)\)")
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


@dataclass
class Served:
    """A ``serve`` process on its embedded store, with what a local process can learn."""

    node: NodeProc
    store: Path  # <data-dir>/store

    @property
    def ports(self) -> dict[str, int]:
        found = _PORTS_LINE.findall(self.node.output())
        assert found, self.node.output()[-2000:]
        return {k: int(v) for k, v in (pair.split("=") for pair in found[-1].split())}

    @property
    def keys(self) -> dict[str, str]:
        keys: dict[str, str] = json.loads((self.store / "keys" / "s3-credentials.json").read_text())
        return keys

    def s3(self, access: str | None = None, secret: str | None = None) -> Any:
        """An S3 client of the store (with its own keys unless others are given)."""
        return boto3.client(
            "s3",
            endpoint_url=f"http://127.0.0.1:{self.ports['s3.port']}",
            region_name="us-east-1",
            aws_access_key_id=access or self.keys["access_key_id"],
            aws_secret_access_key=secret or self.keys["secret_access_key"],
            config=botocore.config.Config(retries={"max_attempts": 1}),
        )

    def peer_key(self) -> bytes:
        body: bytes = self.s3().get_object(Bucket=EMBEDDED_BUCKET, Key=PEER_KEY)["Body"].read()
        return body

    def increment(self, name: str) -> int:
        url = self.node.public_url + "/cells/Counter/a/increment"
        result: int = httpx.post(url, json={"name": name}, timeout=30).json()["result"]
        return result


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    workdir = tmp_path_factory.mktemp("secure-store")
    node = NodeProc("solo", COUNTER_APP, workdir)
    node.start().ready(90)
    try:
        yield Served(node, workdir / "data" / "store")
    finally:
        node.kill()


def test_every_port_of_the_store_listens_on_loopback_only(served: Served) -> None:
    listening = _listening(_children(served.node.proc.pid if served.node.proc else 0))
    assert set(served.ports.values()) <= {port for _, port in listening}
    assert listening and all(host == "127.0.0.1" for host, _ in listening), listening


def test_the_filer_port_neither_serves_nor_changes_the_bucket(served: Served) -> None:
    secret = served.peer_key()
    assert b"key" in secret  # the fleet's peer-signing key is there, in the bucket
    filer = f"http://127.0.0.1:{served.ports['filer.port']}"
    path = f"{filer}/buckets/{EMBEDDED_BUCKET}/{PEER_KEY}"
    got = httpx.get(path, timeout=10)
    assert got.status_code >= 400 and secret not in got.content
    listing = httpx.get(f"{filer}/buckets/{EMBEDDED_BUCKET}/fleet/", timeout=10)
    assert listing.status_code >= 400 and b"peer-auth" not in listing.content
    forged = b'{"key": "forged"}'
    for method in ("PUT", "POST"):
        answer = httpx.request(method, path, content=forged, timeout=10)
        assert answer.status_code >= 400, (method, answer.status_code)
    planted = httpx.put(f"{filer}/buckets/{EMBEDDED_BUCKET}/planted", content=b"x", timeout=10)
    assert planted.status_code >= 400
    assert httpx.delete(path, timeout=10).status_code >= 400
    assert served.peer_key() == secret  # neither replaced nor deleted
    with pytest.raises(ClientError):
        served.s3().head_object(Bucket=EMBEDDED_BUCKET, Key="planted")


def test_the_master_and_volume_ports_neither_serve_nor_delete_the_bucket(served: Served) -> None:
    secret = served.peer_key()
    master = f"http://127.0.0.1:{served.ports['master.port']}"
    dropped = httpx.get(f"{master}/col/delete?collection={EMBEDDED_BUCKET}", timeout=10)
    assert dropped.status_code >= 400
    assert httpx.get(f"{master}/dir/assign", timeout=10).status_code >= 400
    volume = f"http://127.0.0.1:{served.ports['volume.port']}"
    volume_ids = [p.stem.rsplit("_", 1)[-1] for p in served.store.glob(f"{EMBEDDED_BUCKET}_*.dat")]
    assert volume_ids
    for vid in volume_ids:
        for needle in ("01", "02", "03"):  # well-formed ids: a needle key and a cookie
            fid = f"{volume}/{vid},{needle}1234abcd"
            assert httpx.get(fid, timeout=10).status_code == 401
            assert httpx.delete(fid, timeout=10).status_code == 401
            assert httpx.post(fid, content=b"x", timeout=10).status_code == 401
    assert served.peer_key() == secret


def test_every_grpc_port_asks_for_the_stores_client_certificate(served: Served) -> None:
    keys = served.store / "keys"
    grpc_ports = [port for name, port in served.ports.items() if name.endswith(".grpc")]
    assert {"master.port.grpc", "volume.port.grpc", "filer.port.grpc"} <= set(served.ports)
    for port in grpc_ports:
        assert not _grpc_talks(port, None), f"port {port} talks to a client without certificate"
    # The control: with the store's own certificate the same port answers.
    assert _grpc_talks(served.ports["filer.port.grpc"], (keys / "grpc.crt", keys / "grpc.key"))


def test_the_s3_port_refuses_anonymous_and_wrong_keys(served: Served) -> None:
    s3_url = f"http://127.0.0.1:{served.ports['s3.port']}/{EMBEDDED_BUCKET}/{PEER_KEY}"
    anonymous = httpx.get(s3_url, timeout=10)
    assert anonymous.status_code == 403 and b"key" not in anonymous.content
    assert httpx.put(s3_url, content=b"forged", timeout=10).status_code == 403
    assert httpx.delete(s3_url, timeout=10).status_code == 403
    wrong = [
        (served.keys["access_key_id"], "not-the-secret"),
        ("cellactors", "cellactors-embedded-store"),  # the fixed pair of older versions
    ]
    for access, secret in wrong:
        with pytest.raises(ClientError) as refused:
            served.s3(access, secret).get_object(Bucket=EMBEDDED_BUCKET, Key=PEER_KEY)
        assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    assert served.peer_key()  # the control: the node's own keys read it


def test_the_stores_secrets_are_this_users_only(served: Served) -> None:
    keys = served.store / "keys"
    for folder in (served.store, keys):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
    secrets = ["s3-credentials.json", "s3.json", "security.toml", "grpc.key"]
    for name in secrets:
        assert stat.S_IMODE((keys / name).stat().st_mode) == 0o600, name
    assert len(served.keys["secret_access_key"]) >= 32


def test_a_restart_keeps_the_keys_and_the_data(served: Served) -> None:
    before = served.increment("restart")
    keys, secret = served.keys, served.peer_key()
    served.node.signal(signal.SIGTERM)
    assert served.node.wait(30) == 0
    served.node.start().ready(90)
    assert served.keys == keys  # the same pair, not a new one
    assert served.peer_key() == secret  # the same fleet key, read with it
    assert served.increment("restart") == before + 1  # the same cell state


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (the embedded ``weed`` of a ``serve``)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    assert found, f"no child of {pid}"
    return found


def _listening(pids: list[int]) -> set[tuple[str, int]]:
    """The (host, port) every TCP socket of ``pids`` listens on (IPv4 and IPv6)."""
    inodes = set()
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            target = os.readlink(fd) if fd.is_symlink() else ""
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found = set()
    for table, width in (("tcp", 8), ("tcp6", 32)):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            cols = line.split()
            if cols[3] == "0A" and cols[9] in inodes:  # LISTEN
                addr, port = cols[1].split(":")
                found.add((_host(addr, width), int(port, 16)))
    return found


def _host(hex_addr: str, width: int) -> str:
    raw = bytes.fromhex(hex_addr)
    if width == 8:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
    mapped = socket.inet_ntop(socket.AF_INET6, words)
    return mapped.removeprefix("::ffff:") if mapped.startswith("::ffff:") else mapped


def _grpc_talks(port: int, cert: tuple[Path, Path] | None) -> bool:
    """Whether a client gets an HTTP/2 answer from ``port``: in plain text, or over TLS with
    ``cert`` (a client certificate and its key), or over TLS with none."""
    return _h2_answers(port, None) or _h2_answers(port, _tls(cert))


def _tls(cert: tuple[Path, Path] | None) -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    if cert is not None:
        context.load_cert_chain(str(cert[0]), str(cert[1]))
    return context


def _h2_answers(port: int, tls: ssl.SSLContext | None) -> bool:
    """Whether ``port`` answers the HTTP/2 preface with a SETTINGS frame."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
            conn = tls.wrap_socket(raw) if tls is not None else raw
            with conn:
                conn.sendall(_H2_PREFACE + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
                header = conn.recv(9)
                return len(header) == 9 and header[3] == 0x04  # a SETTINGS frame
    except (ssl.SSLError, ConnectionError, TimeoutError):
        return False
