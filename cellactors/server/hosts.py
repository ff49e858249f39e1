"""Which ``Host`` the internal listener answers to: its own names only.

A browser that loads a page from a name the attacker controls, then rebinds that name to
the node's address (DNS rebinding), sends requests whose ``Host`` is the attacker's name:
refusing every name that is not the node's own (loopback names, the address it listens
on, its advertised address, names the operator gives) stops it reading ``/state`` or
driving the fleet page. A request without ``Host`` (HTTP/1.0: no browser) passes.
"""

from __future__ import annotations

import fnmatch
import ipaddress
from collections.abc import Iterable

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from cellactors.errors import UnknownHost
from cellactors.wire import codec

#: Names every node answers to on its internal listener.
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def host_name(value: str) -> str:
    """The name of a ``Host`` value (or an address), without its port, lower case:
    ``[::1]:8081`` is ``::1``, ``Node-A:8081`` is ``node-a``."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:].partition("]")[0]
    if value.count(":") > 1:  # a bare IPv6 address
        return value
    return value.partition(":")[0]


def own_names(bound: str, extra: Iterable[str]) -> tuple[str, ...]:
    """The names the listener answers to: loopback, ``bound`` unless it is a wildcard, and
    ``extra`` (the advertised address, names the operator gives; patterns allowed)."""
    names = list(LOOPBACK_NAMES)
    bound_name = host_name(bound)
    try:
        wildcard = ipaddress.ip_address(bound_name).is_unspecified
    except ValueError:
        wildcard = False
    if bound_name and not wildcard:
        names.append(bound_name)
    names.extend(host_name(e) for e in extra if e.strip())
    return tuple(dict.fromkeys(names))


def answers_to(names: Iterable[str], host: str) -> bool:
    """Whether ``host`` (a ``Host`` header's value) is one of ``names``."""
    name = host_name(host)
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in names)


class HostCheck:
    """Refuse (421 ``unknown_host``, ``not_run``) a request whose ``Host`` is not one of
    the listener's names, before any route sees it."""

    def __init__(self, app: ASGIApp, names: tuple[str, ...]) -> None:
        self.app = app
        self.names = names

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = Headers(scope=scope)
            host = headers.get("host")
            if host is not None and not answers_to(self.names, host):
                err = UnknownHost(f"this node does not answer to {host_name(host)!r}")
                body = codec.encode_error(err, "json")
                await send(
                    {
                        "type": "http.response.start",
                        "status": err.status,
                        "headers": [
                            (b"content-type", codec.JSON_TYPE.encode()),
                            (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close"),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)
