"""The Restate processes of ``python -m bench --peer restate``: its server (one node, every
role, default durability: RocksDB with an fsynced write-ahead log) and the SDK service
serving the Counter virtual object, on free loopback ports, registered through the admin API.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.peer_restate_install import PeerUnavailable, RestateInstall
from bench.procs import ServerProc
from cellactors.persistence.store.embedded import free_port


def server_config(admin: int, ingress: int, fabric: int) -> str:
    """The server's TOML configuration: TCP only, loopback ports, no telemetry."""
    return "\n".join(
        [
            'listen-mode = "tcp"',
            f'bind-address = "127.0.0.1:{fabric}"',
            f'advertised-address = "http://127.0.0.1:{fabric}/"',
            "disable-telemetry = true",
            'log-filter = "warn"',
            "[admin]",
            f'bind-address = "127.0.0.1:{admin}"',
            "[ingress]",
            f'bind-address = "127.0.0.1:{ingress}"',
            "",
        ]
    )


@dataclass
class RestatePeer:
    """A running server and service: the ingress URL to call, their pids to meter."""

    server: ServerProc
    service: ServerProc
    ingress_port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.ingress_port}"

    @property
    def pids(self) -> dict[str, int]:
        return {"server": self.server.pid, "service": self.service.pid}

    @classmethod
    def start(cls, install: RestateInstall, workdir: Path, timeout: float = 90.0) -> RestatePeer:
        """Start both, register the service, wait until a call goes through; on failure
        stop what started and raise :class:`PeerUnavailable` with the logs' tails."""
        workdir.mkdir(parents=True, exist_ok=True)
        admin, ingress, fabric = free_port(), free_port(), free_port()
        config = workdir / "restate.toml"
        config.write_text(server_config(admin, ingress, fabric))
        args = [str(install.server), "--no-logo", "--config-file", str(config)]
        args += ["--base-dir", str(workdir / "restate-data"), "--node-name", "bench"]
        server = ServerProc("restate-server", args, admin, workdir)
        port = free_port()
        service = ServerProc("restate-service", install.service_args(port), port, workdir)
        peer = cls(server, service, ingress)
        try:
            server.start()
            service.start()
            server.ready(timeout, path="/health")
            service.ready(timeout, path="/health")
            peer._register(time.monotonic() + timeout)
        except (RuntimeError, httpx.HTTPError) as exc:
            peer.stop()
            raise PeerUnavailable(f"Restate did not start: {exc}") from exc
        return peer

    def _register(self, deadline: float) -> None:
        """``POST /deployments`` with the service's URI (HTTP/2, the default), then poll
        the ingress until the object answers."""
        admin = self.server.url
        while True:
            with contextlib.suppress(httpx.HTTPError):
                resp = httpx.post(
                    admin + "/deployments", json={"uri": self.service.url}, timeout=10
                )
                if resp.status_code in (200, 201):
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"registration failed: {self.server.tail()}")
            time.sleep(0.2)
        while True:
            with contextlib.suppress(httpx.HTTPError):
                resp = httpx.post(self.url + "/Counter/ready/get", json={"name": "n"}, timeout=10)
                if resp.status_code == 200:
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"ingress never answered: {self.server.tail()}")
            time.sleep(0.2)

    def stop(self) -> None:
        """Stop the service, then the server (each SIGTERM, then SIGKILL)."""
        self.service.stop(timeout=10)
        self.server.stop(timeout=20)
