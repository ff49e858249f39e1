"""``cellactors dev``: a local fleet in one command, for trying forwarding, failover and
drain on one machine.

It starts one embedded SeaweedFS store (as ``serve`` does without ``--bucket``) and N real
``cellactors serve`` processes on loopback ports sharing its bucket, prints their addresses,
process ids and log files, and on SIGINT/SIGTERM drains every node (SIGTERM each), then
stops the store. A node that exits meanwhile (killed, drained) is reported and left down.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import click

from cellactors.cli.failures import (
    EXIT_ADDRESS_IN_USE,
    EXIT_FAILURE,
    EXIT_OK,
    CommandFailed,
    store_failure,
)
from cellactors.cli.log_format import LOG_FORMATS, setup_logging
from cellactors.cli.serve_options import app_option
from cellactors.cli.store_options import ACCESS_KEY_ENV, SECRET_KEY_ENV, StoreArgs
from cellactors.errors import CellactorsError

INTERNAL_OFFSET = 100  # node i's internal port is its public port + 100
STOP_TIMEOUT_S = 60.0


@dataclass
class DevNode:
    """One ``cellactors serve`` child."""

    node_id: str
    public_port: int
    internal_port: int
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    reported: bool = False

    @property
    def public_url(self) -> str:
        return f"http://127.0.0.1:{self.public_port}"

    @property
    def internal_url(self) -> str:
        return f"http://127.0.0.1:{self.internal_port}"

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.public_url + "/healthz", timeout=1) as resp:
                return int(resp.status) == 200
        except (urllib.error.URLError, OSError):
            return False


def _ports(base: int, count: int) -> list[tuple[int, int]]:
    """(public, internal) per node: BASE+i and BASE+100+i, or free ports when BASE is 0."""
    from cellactors.persistence.store.embedded import free_port

    if base == 0:
        return [(free_port(), free_port()) for _ in range(count)]
    if base + INTERNAL_OFFSET + count - 1 > 65535:
        raise CommandFailed(f"--base-port {base}: the ports of {count} nodes exceed 65535")
    return [(base + i, base + INTERNAL_OFFSET + i) for i in range(count)]


def _check_ports(ports: list[tuple[int, int]]) -> None:
    """Fail before starting anything when a port is taken."""
    from cellactors.cli.listeners import Listeners, ListenerUnavailable, parse_address
    from cellactors.cli.listeners import reserve_listeners as reserve

    for public, internal in ports:
        pub = parse_address(f"127.0.0.1:{public}", "--listen")
        intl = parse_address(f"127.0.0.1:{internal}", "--internal-listen")
        try:
            held = reserve(Listeners(pub, intl, intl))
        except ListenerUnavailable as err:
            raise CommandFailed(str(err), EXIT_ADDRESS_IN_USE) from err
        for sock in held.values():
            sock.close()


def _child_env(access: str, secret: str) -> dict[str, str]:
    """This environment without CELLACTORS_* settings (flags decide), plus the store keys."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CELLACTORS_")}
    env.update({ACCESS_KEY_ENV: access, SECRET_KEY_ENV: secret, "PYTHONUNBUFFERED": "1"})
    return env


def _serve_args(
    node: DevNode, app: str, endpoint: str, data_dir: Path, options: list[str]
) -> list[str]:
    from cellactors.cli.embedded_store import EMBEDDED_BUCKET

    return [
        sys.executable,
        "-m",
        "cellactors.cli",
        "serve",
        "--app",
        app,
        "--bucket",
        f"s3://{EMBEDDED_BUCKET}",
        "--endpoint",
        endpoint,
        "--node",
        node.node_id,
        "--listen",
        f"127.0.0.1:{node.public_port}",
        "--internal-listen",
        f"127.0.0.1:{node.internal_port}",
        "--data-dir",
        str(data_dir / node.node_id),
        *options,
    ]


def _stop_nodes(nodes: list[DevNode]) -> bool:
    """SIGTERM every running node (each drains), wait, SIGKILL stragglers; True when every
    node that was still running exited 0."""
    running = [n for n in nodes if n.proc is not None and n.proc.poll() is None]
    for node in running:
        assert node.proc is not None
        node.proc.send_signal(signal.SIGTERM)
    clean = True
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for node in running:
        assert node.proc is not None
        try:
            code = node.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            node.proc.kill()
            code = node.proc.wait()
        clean = clean and code == 0
        click.echo(f"{node.node_id} stopped (exit {code})")
    return clean


@click.command("dev")
@app_option()
@click.option(
    "--nodes", "count", default=3, show_default=True, type=click.IntRange(1, 32), help="Nodes."
)
@click.option(
    "--base-port",
    default=8080,
    show_default=True,
    type=click.IntRange(0, 65535),
    help="Node i (from 0) listens on BASE+i (public) and BASE+100+i (internal); 0 picks "
    "free ports.",
)
@click.option(
    "--data-dir",
    default="./cellactors-dev",
    show_default=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="The store, each node's cell databases, and the node logs.",
)
@click.option(
    "--lease-ttl",
    default=5.0,
    show_default=True,
    type=click.FloatRange(min=0.5),
    metavar="SECONDS",
    help="Node lease TTL: a killed node's cells move after this long.",
)
@click.option(
    "--log-level",
    default="info",
    show_default=True,
    type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
)
@click.option(
    "--log-format",
    default="text",
    show_default=True,
    type=click.Choice(LOG_FORMATS, case_sensitive=False),
    help="Passed to every node.",
)
def dev(
    app: str,
    count: int,
    base_port: int,
    data_dir: Path,
    lease_ttl: float,
    log_level: str,
    log_format: str,
) -> None:
    """Run a local fleet: one embedded store and NODES `cellactors serve` processes sharing
    it on loopback, until Ctrl-C (SIGINT) or SIGTERM stops them all."""
    from cellactors.cli.app_loader import absolute_spec, load_app
    from cellactors.cli.embedded_store import start_embedded_store
    from cellactors.persistence.store.embedded import die_with_parent

    setup_logging(log_level, log_format)
    try:
        load_app(app)  # a broken app fails here, once, rather than in every node
    except CellactorsError as err:
        raise CommandFailed(str(err)) from err
    ports = _ports(base_port, count)
    _check_ports(ports)
    data_dir = data_dir.resolve()
    app_arg = absolute_spec(app)
    nodes = [
        DevNode(f"node-{i + 1}", pub, intl, data_dir / f"node-{i + 1}.log")
        for i, (pub, intl) in enumerate(ports)
    ]

    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    server = None
    code = EXIT_OK
    try:
        try:
            server, bucket = start_embedded_store(data_dir / "store", StoreArgs())
            bucket.close()
        except CellactorsError as err:
            raise store_failure(err, None) from err
        assert server.proc is not None
        click.echo(f"store: s3://cellactors at {server.endpoint} (pid {server.proc.pid})")
        keys = server.credentials  # the store's own pair, kept under its keys/
        env = _child_env(keys.access_key_id, keys.secret_access_key)
        options = ["--lease-ttl", str(lease_ttl), "--log-level", log_level]
        options += ["--log-format", log_format]
        cwd = Path.cwd()
        for node in nodes:
            with open(node.log_path, "ab") as out:
                node.proc = subprocess.Popen(
                    _serve_args(node, app_arg, server.endpoint, data_dir, options),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=cwd,
                    start_new_session=True,  # Ctrl-C reaches dev only; dev stops the nodes
                    preexec_fn=die_with_parent,
                )
        code = _wait_ready(nodes, stop)
        if code == EXIT_OK and not stop.is_set():
            for node in nodes:
                assert node.proc is not None
                click.echo(
                    f"{node.node_id}: public {node.public_url}  internal {node.internal_url}  "
                    f"pid {node.proc.pid}  log {node.log_path}"
                )
            click.echo(f"fleet ready: {count} nodes; Ctrl-C stops them all")
            code = _supervise(nodes, stop)
    finally:
        clean = _stop_nodes(nodes)
        if server is not None:
            server.stop()
            click.echo("store stopped")
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if code == EXIT_OK and not clean:
        code = EXIT_FAILURE
    sys.exit(code)


def _wait_ready(nodes: list[DevNode], stop: threading.Event, timeout: float = 120.0) -> int:
    """Poll every node's /healthz until all answer 200; a node that exits first fails it."""
    deadline = time.monotonic() + timeout
    pending = list(nodes)
    while pending and not stop.is_set():
        for node in list(pending):
            assert node.proc is not None
            status = node.proc.poll()
            if status is not None:
                click.echo(
                    f"error: {node.node_id} exited with status {status} while starting; "
                    f"see {node.log_path}",
                    err=True,
                )
                return EXIT_FAILURE
            if node.healthy():
                pending.remove(node)
        if time.monotonic() > deadline:
            names = ", ".join(n.node_id for n in pending)
            click.echo(f"error: {names} not ready after {timeout:.0f}s", err=True)
            return EXIT_FAILURE
        stop.wait(0.1)
    return EXIT_OK


def _supervise(nodes: list[DevNode], stop: threading.Event) -> int:
    """Report nodes that exit; return when stopped (0) or when no node is left (1)."""
    while not stop.wait(0.2):
        for node in nodes:
            assert node.proc is not None
            status = node.proc.poll()
            if status is not None and not node.reported:
                node.reported = True
                click.echo(f"{node.node_id} exited with status {status}; it stays down")
        if all(n.reported for n in nodes):
            click.echo("error: every node has exited", err=True)
            return EXIT_FAILURE
    return EXIT_OK
