"""Listen addresses, as the command line checks them and the listeners judge them (pure, no
server import: every ``cellactors`` command loads it)."""

from __future__ import annotations

import ipaddress


def is_loopback(host: str) -> bool:
    """Whether a listen address is this machine's loopback (only local processes reach it)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
