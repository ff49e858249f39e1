"""An in-process forwarder between nodes, with nodes that can be made unreachable."""

from __future__ import annotations

from typing import Any

from cellactors import Node
from cellactors.core.principal import Principal
from cellactors.errors import NodeUnavailable, RemoteOwner


class Peers:
    """An in-process forwarder: the owner's ``Node`` runs the call (as its internal
    listener would); ``down`` makes a node unreachable."""

    def __init__(self, *nodes: Node) -> None:
        self.nodes = {n.node_id: n for n in nodes}
        self.down: set[str] = set()
        self.forwards = 0
        for n in nodes:
            n.set_forwarder(self)

    def __call__(
        self,
        owner: RemoteOwner,
        cls_name: str,
        name: str,
        method: str,
        kwargs: dict[str, Any],
        key: str | None,
        chain: tuple[str, ...],
        caller: Principal | None = None,
    ) -> Any:
        if owner.node in self.down:
            raise NodeUnavailable(f"{owner.node} is down")
        self.forwards += 1
        return self.nodes[owner.node].call(
            cls_name, name, method, kwargs, forwarded=True, key=key, chain=chain, caller=caller
        )
