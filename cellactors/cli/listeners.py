"""Where a node listens: its public and internal addresses, checked and bound (and held,
without listening) before the store is touched, so that a port in use fails at once
(exit 6) without a bucket write."""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass

from cellactors.wire.addresses import is_loopback

DEFAULT_LISTEN = "127.0.0.1:8080"
DEFAULT_INTERNAL = "127.0.0.1:8081"


class StartupError(Exception):
    """A refusal to start: printed as ``error: ...`` and exit status 2."""


class ListenerUnavailable(StartupError):
    """A listen address cannot be bound (in use, or not an address of this machine)."""


@dataclass(frozen=True)
class Address:
    """A ``HOST:PORT`` pair as given on the command line."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def is_loopback(self) -> bool:
        return is_loopback(self.host)

    @property
    def is_wildcard(self) -> bool:
        return self.host in ("", "0.0.0.0", "::", "[::]")


def parse_address(text: str, flag: str) -> Address:
    """Parse ``HOST:PORT`` (IPv6 as ``[::1]:PORT``); StartupError naming ``flag``."""
    raw = text.strip()
    match = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\]:(\d{1,5})", raw) or re.fullmatch(
        r"([A-Za-z0-9.\-_]*):(\d{1,5})", raw
    )
    if not match:
        raise StartupError(f"{flag} {text!r}: expected HOST:PORT (e.g. 127.0.0.1:8080)")
    host, port = match.group(1), int(match.group(2))
    if not host:
        raise StartupError(f"{flag} {text!r}: give a host (0.0.0.0 for every interface)")
    if port > 65535:
        raise StartupError(f"{flag} {text!r}: port out of range")
    return Address(host, port)


def default_node_id() -> str:
    """The host name, reduced to the characters node ids allow."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", socket.gethostname())[:128].strip(".")
    return name or "node"


@dataclass(frozen=True)
class Listeners:
    """Where to listen and what to advertise to peers."""

    public: Address
    internal: Address
    advertise: Address


def plan_listeners(listen: str, internal_listen: str | None, advertise: str | None) -> Listeners:
    """Check the listener flags against the rules of docs/protocol.md ("Routing and forwarding")."""
    public = parse_address(listen, "--listen")
    if internal_listen is None and not public.is_loopback:
        raise StartupError(
            f"--listen {public} is not a loopback address: give --internal-listen explicitly "
            "(a private address peers can reach, never a public one); the internal listener "
            "takes signed calls from peers and serves /state and /metrics"
        )
    internal = parse_address(internal_listen or DEFAULT_INTERNAL, "--internal-listen")
    if internal.port != 0 and internal == public:
        raise StartupError(f"--listen and --internal-listen are both {public}")
    if advertise is None:
        if internal.is_wildcard:
            raise StartupError(
                f"--internal-listen {internal} listens on every interface: give --advertise "
                "HOST:PORT, the address peers use to reach this node"
            )
        adv = internal
    else:
        adv = parse_address(advertise, "--advertise")
        if adv.is_wildcard:
            raise StartupError(
                f"--advertise {adv}: 0.0.0.0 is a listen address, not one peers can reach; "
                "advertise this node's private IP or host name"
            )
    if adv.port == 0:
        raise StartupError("the advertised internal address needs a real port, not 0")
    return Listeners(public, internal, adv)


def reserve_listeners(listeners: Listeners) -> dict[str, socket.socket]:
    """Bind both listen addresses without listening, so a port in use fails before the store
    starts; the servers then listen on these very sockets (``"public"``, ``"internal"``),
    so no other process can take a port between the check and the serving. Port 0 is
    skipped: the server binds any free port itself."""
    held: dict[str, socket.socket] = {}
    for which, flag, addr in (
        ("public", "--listen", listeners.public),
        ("internal", "--internal-listen", listeners.internal),
    ):
        if addr.port == 0:
            continue
        try:
            family, kind, proto, _, sockaddr = socket.getaddrinfo(
                addr.host, addr.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
            )[0]
            sock = socket.socket(family, kind, proto)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind(sockaddr)
            except BaseException:
                sock.close()
                raise
        except OSError as err:
            for other in held.values():
                other.close()
            reason = err.strerror or str(err)
            raise ListenerUnavailable(f"{flag} {addr}: cannot listen there: {reason}") from err
        held[which] = sock
    return held
